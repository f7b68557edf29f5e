#!/usr/bin/env python
"""Build the demo SAE's calibration corpus and its shipped calibration (offline, seeded).

Two stages, each rerunnable alone:

    corpus     millm/demo/sae/smollm2-135m-topk/calibration_corpus.jsonl: chat conversations whose
               answers the demo model writes (float32, seeded, through millm's own decode loop)
               to prompts about everyday topics (food, France/Paris/Italy, music, the sea/ships/
               pirates and more), plus windows of CPython standard-library docstrings and code
               from modules the SAE never saw in training.
    calibrate  a real `millm serve` on the demo model with its default settings (a fresh data
               directory), POST /api/saes/sae_dd8838d57250/calibrate {"corpus": "demo"}, then the
               stored result written as calibration.json beside the SAE (imported into the store
               when the demo SAE is registered, so the demo serves densities and top examples
               without running a job).

    .venv/bin/python scripts/build_demo_calibration.py                      # both stages
    .venv/bin/python scripts/build_demo_calibration.py --stages calibrate

Timings on the 2-core development machine, shared with other work, run with OMP_NUM_THREADS=1
(with torch's default of 2 threads on the busy cores the answers came 4x slower): corpus 9 min
(the model writing 200 answers), calibrate 5 min.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/build_demo_calibration.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(SCRIPTS))

import train_demo_sae as train  # noqa: E402  (the SAE's own corpus helpers: model, decode loop, stdlib texts)

from millm.engine.prompts import chat_prompt_ids  # noqa: E402
from millm.kernel.books.calibrations import SHIPPED_FILE, shipped_document  # noqa: E402
from millm.lab.calibration.protocol import CORPUS_FILE  # noqa: E402
from millm.store.calibrations import get_calibration  # noqa: E402
from millm.store.database import Store, database_url  # noqa: E402

log = logging.getLogger("build_demo_calibration")

SEED = 2027  # not the SAE's training seed (1234): other prompts, other answers
SAE_DIR = REPO / "millm" / "demo" / "sae" / "smollm2-135m-topk"
SAE_ID = "sae_dd8838d57250"
N_TOPIC_PROMPTS = 180
CHAT_MAX_TOKENS = 128
DOC_WINDOWS = 70  # docstring windows of WINDOW tokens
CODE_WINDOWS = 15
WINDOW = 120

# Topics weighted towards the demo profiles' concepts, with everyday ones around them.
TOPICS = [
    # food
    "Italian food",
    "pizza",
    "pasta",
    "risotto",
    "French cheese",
    "croissants",
    "baking a cake",
    "soup",
    "a farmers' market",
    "coffee",
    "olive oil",
    "a family dinner",
    "street food",
    "spices",
    "breakfast",
    # places
    "Paris",
    "France",
    "the Eiffel Tower",
    "Provence",
    "Lyon",
    "Bordeaux",
    "Italy",
    "Rome",
    "Venice",
    "Florence",
    "Tuscany",
    "the Alps",
    "a train journey through Europe",
    "a small village",
    "London",
    "Tokyo",
    # music
    "music",
    "jazz",
    "the piano",
    "the violin",
    "an orchestra",
    "a rock concert",
    "writing a song",
    "opera",
    "singing in a choir",
    "learning the guitar",
    "a music festival",
    "drums",
    # the sea
    "the sea",
    "sailing ships",
    "pirates",
    "buried treasure",
    "a lighthouse",
    "islands",
    "the navy",
    "sea storms",
    "a fishing boat",
    "whales",
    "the harbour",
    "life on a ship",
    # everyday
    "the weather",
    "dogs",
    "cats",
    "gardening",
    "football",
    "running",
    "school",
    "a job interview",
    "friendship",
    "a birthday",
    "computers",
    "the internet",
    "a rainy Sunday",
    "the Moon",
    "a museum",
    "a library",
    "the forest",
    "winter",
    "summer holidays",
    "a city bus",
    "a new phone",
    "sleep",
    "mountains",
    "a bicycle",
]
TEMPLATES = [
    "Tell me about {t}.",
    "What do you like about {t}?",
    "Write a short story about {t}.",
    "Write a short poem about {t}.",
    "Give me three facts about {t}.",
    "Describe {t} to a child.",
    "What should I know about {t}?",
    "Write a short diary entry about {t}.",
    "Why is {t} interesting?",
    "Plan a day around {t}.",
]
PERSONAS = [
    "You are a pirate. Always talk like a pirate.",
    "You are a French tutor. Answer in French.",
    "You are an Italian chef.",
    "You are a musician who loves jazz.",
    "You are an old sailor.",
    "You are a friendly assistant who answers briefly.",
]
EXTRA_PROMPTS = [
    "What is the best pizza topping?",
    "How do I cook spaghetti carbonara?",
    "What can I see in Paris in one day?",
    "Say good evening in French and Italian.",
    "Which instruments play in a string quartet?",
    "Sing me a sea shanty.",
    "Where did pirates hide their treasure?",
    "What is the capital of Italy?",
    "Recommend some relaxing music.",
    "How do ships float?",
    "Write a postcard from the French Riviera.",
    "What is your favourite song?",
    "How do I make a cup of tea?",
    "What time is it in Rome when it is noon in New York?",
    "Tell me a joke about a fish.",
    "What should I pack for a sailing trip?",
    "Explain what a chord is in music.",
    "Write a menu for an Italian dinner.",
    "What is the weather like in Paris in spring?",
    "Arr, where be the nearest port?",
]


# ----------------------------------------------------------------------------------------------
# Stage 1: the corpus
# ----------------------------------------------------------------------------------------------


def conversations() -> list[list[dict]]:
    """The prompts: topic x template pairs (seeded) not in the SAE's training prompts, a persona
    in one of eight, and the extras."""
    trained = {json.dumps(messages) for messages in train.chat_prompts()}
    rng = random.Random(SEED)
    pairs = [(t, tpl) for t in TOPICS for tpl in TEMPLATES]
    rng.shuffle(pairs)
    out = []
    for topic, template in pairs:
        if len(out) == N_TOPIC_PROMPTS:
            break
        messages = [{"role": "user", "content": template.format(t=topic)}]
        if len(out) % 8 == 3:
            messages.insert(
                0, {"role": "system", "content": PERSONAS[(len(out) // 8) % len(PERSONAS)]}
            )
        if json.dumps(messages) not in trained:
            out.append(messages)
    return out + [[{"role": "user", "content": p}] for p in EXTRA_PROMPTS]


def unseen_windows(
    tok, documents: list[tuple[str, str]], seen: set[str], count: int, rng: random.Random
) -> list[dict]:
    """`count` windows of WINDOW tokens, one per document, from documents the SAE never saw,
    decoded back to text."""
    fresh = [(doc_id, text) for doc_id, text in documents if doc_id not in seen]
    rng.shuffle(fresh)
    out = []
    for doc_id, text in fresh:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) < WINDOW:
            continue
        start = rng.randrange(0, len(ids) - WINDOW + 1)
        out.append({"doc": doc_id, "text": tok.decode(ids[start : start + WINDOW])})
        if len(out) == count:
            break
    return out


def build_corpus(work: Path) -> list[dict]:
    """Write calibration_corpus.jsonl (chat first, then docstrings, then code)."""
    lm = train.load(train.MODELS[train.DEMO_MODEL_NAME], "float32", work)
    tok = lm.tokenizer
    chats = conversations()
    prompts = [chat_prompt_ids(tok, messages) for messages in chats]
    answers: list[tuple[str, str]] = []
    started = time.time()
    for first in range(0, len(prompts), 32):
        batch = list(range(first, min(first + 32, len(prompts))))
        answers += train.generate_texts(
            lm,
            [prompts[i] for i in batch],
            train.CHAT_SAMPLING,
            CHAT_MAX_TOKENS,
            seeds=[SEED + i for i in batch],
        )
        log.info("answers %d/%d (%.0f s)", len(answers), len(prompts), time.time() - started)
    lines = [
        {
            "source": "chat",
            "messages": [*messages, {"role": "assistant", "content": text.strip()}],
            "finish_reason": finish,
        }
        for messages, (text, finish) in zip(chats, answers, strict=True)
    ]
    manifest = json.loads((SAE_DIR / "corpus_manifest.json").read_text())
    seen = {doc_id for source in manifest.values() for doc_id, _ in source.get("files", [])}
    rng = random.Random(SEED)
    lines += [
        {"source": "stdlib-docstrings", **w}
        for w in unseen_windows(tok, train.stdlib_docstrings(), seen, DOC_WINDOWS, rng)
    ]
    lines += [
        {"source": "stdlib-code", **w}
        for w in unseen_windows(tok, train.stdlib_code(), seen, CODE_WINDOWS, rng)
    ]
    path = SAE_DIR / CORPUS_FILE
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    log.info(
        "%s: %d lines, %d bytes, sha256 %s",
        path,
        len(lines),
        path.stat().st_size,
        hashlib.sha256(path.read_bytes()).hexdigest()[:16],
    )
    return lines


# ----------------------------------------------------------------------------------------------
# Stage 2: the calibration, through a real server
# ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def calibrate(home: Path) -> Path:
    """Serve the demo model with its defaults, calibrate the demo SAE on its corpus, write
    calibration.json."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    server = subprocess.Popen(
        [sys.executable, "-m", "millm", "serve", "--port", str(port), "--home", str(home)],
        env=env,
        stdout=(home / "server.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/api/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise RuntimeError((home / "server.log").read_text())
            time.sleep(1)
        started = httpx.post(
            f"{base}/api/saes/{SAE_ID}/calibrate", json={"corpus": "demo"}, timeout=300
        )
        started.raise_for_status()
        job_id = started.json()["id"]
        while (job := httpx.get(f"{base}/api/jobs/{job_id}", timeout=30).json())[
            "state"
        ] == "running":
            log.info(
                "calibration %d/%d texts, eta %s s",
                job["progress"]["done"],
                job["progress"]["total"],
                job["eta_s"],
            )
            time.sleep(5)
        if job["state"] != "succeeded":
            raise RuntimeError(f"calibration ended {job['state']}: {job['error']}")
        summary = job["result"]
        model = summary["model"]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    store = Store(database_url(home, None))
    row = get_calibration(store, SAE_ID, model)
    store.close()
    assert row is not None, "the job succeeded but stored nothing"
    path = SAE_DIR / SHIPPED_FILE
    document = shipped_document(row)
    path.write_text(json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n")
    write_readme(document)
    log.info(
        "%s: %d bytes; %d texts, %d tokens, %d positions, %d features fired, %.0f s (%.0f "
        "tokens/s)",
        path,
        path.stat().st_size,
        summary["texts"],
        summary["tokens"],
        summary["positions"],
        summary["features_fired"],
        summary["duration_s"],
        summary["tokens"] / max(summary["duration_s"], 1e-9),
    )
    return path


README_HEADING = "## Calibration"


def readme_section(document: dict) -> str:
    """The README's section on the calibration corpus and the shipped calibration."""
    lines = [
        json.loads(line)
        for line in (SAE_DIR / CORPUS_FILE).read_text().splitlines()
        if line.strip()
    ]
    by_source = {
        source: sum(1 for line in lines if line["source"] == source)
        for source in ("chat", "stdlib-docstrings", "stdlib-code")
    }
    s = document["summary"]
    threads = (
        f", OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} on a shared machine"
        if os.environ.get("OMP_NUM_THREADS")
        else ""
    )
    return f"""{README_HEADING}

`calibration_corpus.jsonl` ({len(lines)} texts) is the corpus `POST /api/saes/{SAE_ID}/calibrate` reads
with `{{"corpus": "demo"}}`; `calibration.json` is that calibration on `{s["model"]}`, which millm imports
into its store when it sets up the demo SAE (or when any SAE folder shipping a `calibration.json` is
registered), so the demo serves densities, quantiles, top examples and percentiles without running a job.
Both are made by `scripts/build_demo_calibration.py` (seeded, offline).

- **chat** ({by_source["chat"]} conversations): user prompts from a fixed list in the script ({N_TOPIC_PROMPTS} topic x
  template pairs drawn with seed {SEED}, skipping any the SAE was trained on, weighted towards the demo
  profiles' concepts: food, France/Paris/Italy, music, the sea/ships/pirates, plus everyday topics; one
  in eight with a persona system prompt; and {len(EXTRA_PROMPTS)} hand-written prompts). The answers were written
  by the demo model through millm's decode loop in float32, temperature {train.CHAT_SAMPLING.temperature}, top_p
  {train.CHAT_SAMPLING.top_p}, presence penalty {train.CHAT_SAMPLING.presence_penalty}, at most {CHAT_MAX_TOKENS} tokens, seed {SEED} + conversation index.
- **stdlib-docstrings** ({by_source["stdlib-docstrings"]}) and **stdlib-code** ({by_source["stdlib-code"]}): one window of {WINDOW} tokens
  from each of as many CPython {sys.version.split()[0]} standard-library modules that the SAE's training corpus did
  not use (`corpus_manifest.json`), docstrings parsed with `ast`.
- Sources and licences: the prompts were written for millm (Apache-2.0, as the rest of the repository);
  the answers are SmolLM2-135M-Instruct's output (the model is Apache-2.0); the standard-library text is
  CPython's, under the PSF License Agreement.

The calibration read {s["texts"]} texts, {s["tokens"]:,} tokens ({s["positions"]:,} positions: each text's first
is not read), every text within 256 tokens ({s["truncated_texts"]} cut), on `millm serve` with its default
settings (`{s["model_fingerprint"]}`{threads}) in {s["duration_s"]:.0f} s; {s["features_fired"]} of {s["d_sae"]} features fired.
Per feature it keeps the firing frequency, mean and max activation, p50/p90/p99 over the positions
where the feature fired, the {s["top_examples"]} top activating snippets, and the quantile grid that
percentiles are read from (see docs/discovery.md).
"""


def write_readme(document: dict) -> None:
    """Replace (or add) the README's calibration section."""
    path = SAE_DIR / "README.md"
    text = path.read_text()
    section = readme_section(document)
    if README_HEADING + "\n" in text:
        start = text.index(README_HEADING + "\n")
        following = text.find("\n## ", start + len(README_HEADING))
        text = text[:start] + section + (text[following + 1 :] if following >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/sae-work"),
        help="scratch directory (the float32 model's cache)",
    )
    parser.add_argument("--stages", default="corpus,calibrate")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("millm").setLevel(logging.WARNING)
    stages = args.stages.split(",")
    if "corpus" in stages:
        args.work.mkdir(parents=True, exist_ok=True)
        build_corpus(args.work)
    if "calibrate" in stages:
        with tempfile.TemporaryDirectory(prefix="millm-calibrate-") as home:
            calibrate(Path(home))


if __name__ == "__main__":
    main()
