"""Training a dictionary on the demo model, against the shipped demo SAE, in one run.

Goals: a TopK SAE at layer 12 (2,048 latents, k = 32) trained in <= 10 minutes reaches variance
explained >= the shipped demo SAE's on the same held-out text, CE loss recovered >= 0.9 and dead
fraction <= 10 %; activations reach the trainer at >= 80 % of a plain forward pass's tokens per
second; the buffer's memory is bounded whatever the corpus (it is `buffer_tokens` rows).

The corpus is text already on the machine (the docstrings of Python's standard library, and
Debian's /usr/share/doc), written to one JSONL file and read by the training as a client's file
would be. One server (`millm serve`: the demo model with its SAE attached):
  1. the plain forward pass's speed: each of the first --reference windows of the corpus sent
     alone as a /v1/completions prompt (token ids, max_tokens 1), prompt tokens over wall time
     (the one decoded token and the HTTP round trip count against it);
  2. the shipped SAE graded on the corpus's held-out windows (every 20th);
  3. POST /api/saes/train, attach and grade on the same held-out windows; the training's own
     timing says how fast it read activations and how long the SAELens steps took.

    .venv/bin/python bench/dictionary_training.py [--tokens 2000000] [--epochs 8] [--lr 0.002]
        [--engine transformers|auto]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

CHARS_PER_TOKEN = 3.5  # about, for this tokenizer on English prose and code


def local_documents(chars: int) -> list[str]:
    """Docstrings of the standard library, then Debian's plain-text docs, up to `chars`."""
    out: list[str] = []
    total = 0
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if "test" in path.parts or "idlelib" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                text = ast.get_docstring(node)
                if text and len(text) > 200:
                    out.append(text)
                    total += len(text)
        if total >= chars:
            return out
    for path in sorted(Path("/usr/share/doc").rglob("*")):
        if path.is_file() and path.suffix in ("", ".txt") and path.stat().st_size < 200_000:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            out.append(text)
            total += len(text)
            if total >= chars:
                break
    return out


def write_spread(path: Path, documents: list[dict], talks: list[dict]) -> None:
    """One JSONL corpus of text rows and chat rows spread through each other in proportion, so
    that every stretch of it (an epoch's read, the held-out windows) holds both."""
    spread = sorted(
        [(i / max(len(documents), 1), 0, row) for i, row in enumerate(documents)]
        + [(i / max(len(talks), 1), 1, row) for i, row in enumerate(talks)],
        key=lambda entry: entry[:2],
    )
    path.write_text("".join(json.dumps(row) + "\n" for _, _, row in spread))


def corpus_server(tokens: int, epochs: int, engine: str) -> tuple[Path, list[str], ServerProcess]:
    """The corpus a training of `tokens` over `epochs` reads (one JSONL file, in a fresh data
    directory), its documents, and a demo server on `engine` allowed to read it."""
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    corpus = home / "corpus.jsonl"
    documents = local_documents(int(tokens / epochs * 1.25 * CHARS_PER_TOKEN))
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    flags = ["--log-level", "warning", "--engine", engine]
    return corpus, documents, ServerProcess(home, flags, allowed=[home]).wait_ready(600)


def finished(client: httpx.Client, path: str, timeout: float = 3600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.get(path).json()
        if view["state"] != "running":
            return view
        time.sleep(2)
    raise SystemExit(f"{path} did not end")


def trained(client: httpx.Client, body: dict) -> tuple[dict, float]:
    """POST /api/saes/train `body` and wait: the training's view once succeeded, and the wall time
    it took (its follow-ups included)."""
    began = time.monotonic()
    started = client.post("/api/saes/train", json=body)
    started.raise_for_status()
    view = finished(client, f"/api/saes/trainings/{started.json()['id']}")
    if view["state"] != "succeeded":
        raise SystemExit(json.dumps(view, indent=1))
    return view, time.monotonic() - began


def reference_speed(client: httpx.Client, corpus: Path, windows: int, size: int) -> float:
    """Prompt tokens per second of single plain passes over the corpus's first windows."""
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()[:windows]]
    ids = [client.post("/tokenize", json={"prompt": t}).json()["tokens"][:size] for t in texts]
    ids = [i for i in ids if len(i) == size][:windows]
    began, tokens = time.monotonic(), 0
    for prompt in ids:
        body = {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 1}
        client.post("/v1/completions", json=body).raise_for_status()
        tokens += len(prompt)
    return tokens / (time.monotonic() - began)


def training_arguments(doc: str, batch: int) -> argparse.ArgumentParser:
    """The command line both training benchmarks share: tokens, epochs, engine, lr, batch."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2_000_000, help="trained on, all epochs")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--engine", default="transformers", help="auto: llama.cpp for the demo")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=batch)
    return parser


def main() -> None:
    parser = training_arguments(__doc__, batch=4096)
    parser.add_argument("--reference", type=int, default=48, help="windows timed plainly")
    args = parser.parse_args()
    corpus, documents, server = corpus_server(args.tokens, args.epochs, args.engine)
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            shipped = client.get("/api/saes").json()["data"][0]["id"]
            plain = reference_speed(client, corpus, args.reference, 128)
            source = {"files": [str(corpus)], "context_size": 128}
            held_out = {"corpus": source, "part": "held_out", "max_tokens": 16384}
            job = client.post(f"/api/saes/{shipped}/grade", json=held_out).json()
            shipped_card = finished(client, f"/api/jobs/{job['id']}")["result"]
            body = {
                "layer": 12, "d_sae": 2048, "k": 32, "training_tokens": args.tokens,
                "batch_tokens": args.batch, "lr": args.lr, "epochs": args.epochs, "corpus": source,
                "then": {"attach": True, "grade": True},
            }  # fmt: skip
            view, wall = trained(client, body)
            trained_card = client.get(f"/api/saes/{view['result']['sae_id']}/grades").json()[
                "data"
            ][0]
    finally:
        server.stop()
    timing = view["progress"]["timing"]
    read_speed = timing["tokens_read"] / timing["read_s"]
    result = {
        "engine": args.engine,
        "corpus_documents": len(documents),
        "activations_read": view["progress"]["rows_read"],
        "epochs": args.epochs,
        "tokens_trained": view["progress"]["tokens"],
        "steps": view["progress"]["steps"],
        "wall_s_with_grade": round(wall, 1),
        "read_s": timing["read_s"],
        "train_s": timing["train_s"],
        "read_tokens_per_s": round(read_speed),
        "plain_forward_tokens_per_s": round(plain),
        "read_over_plain": round(read_speed / plain, 3),
        "buffer_mib": round(16 * args.batch * 576 * 4 / 2**20, 1),
        "trained": trained_card["figures"],
        "shipped": shipped_card["figures"],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
