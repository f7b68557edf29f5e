#!/usr/bin/env python
"""Build the demo's transcoder set with millm's own jobs, as any user would train one.

    .venv/bin/python scripts/build_demo_dictionaries.py [--tokens 900000] [--epochs 16]

One demo server (`millm serve --engine transformers`, in a fresh data directory) does all of it
through its API:
  1. corpus   text already on the machine (bench/dictionary_training.py's: the standard library's
              docstrings, Debian's /usr/share/doc) and the demo SAE's calibration chats, spread
              through each other in one JSONL file the training reads as a client's file;
  2. train    POST /api/saes/train, `kind: transcoder_set` (SAELens's BatchTopK, a transcoder per
              block, saved as SAELens JumpReLU transcoders under circuit-tracer's config.yaml);
  3. grade    POST /api/transcoders/{id}/grade on the corpus's held-out windows;
  4. labels   each block registered and attached as an SAE, calibrated on the calibration chats,
              labelled by its top tokens (POST /api/saes/{id}/labels/top-tokens), its labels
              exported beside its weights (`layer_{i}/sae_weights.labels.json`);
  5. ship     the set copied to millm/demo/transcoders/smollm2-135m-jumprelu in float16 (half the
              checkout; millm and SAELens read it as float32), with its grade card (`grade.json`,
              shown for these very weights) and README.

On 2 CPU cores: about 4 minutes reading, 25 training, 1 grading, 8 labelling.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dictionary_training import (  # noqa: E402
    CHARS_PER_TOKEN,
    finished,
    local_documents,
    trained,
    write_spread,
)
from millm.interp.sae_files import content_id  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

DEMO = ROOT / "millm" / "demo"
CHATS = DEMO / "sae" / "smollm2-135m-topk" / "calibration_corpus.jsonl"
SET_OUT = DEMO / "transcoders" / "smollm2-135m-jumprelu"
GRADE_TOKENS = 8192


def write_corpus(home: Path, tokens: int, epochs: int) -> list[str]:
    """The training corpus in `home`, one JSONL file: local text and the calibration chats spread
    through each other, so that the first windows read (an epoch's share) hold both."""
    documents = [{"text": d} for d in local_documents(int(tokens / epochs * CHARS_PER_TOKEN))]
    talks = [{"messages": m} for m in chats()]
    corpus = home / "corpus.jsonl"
    write_spread(corpus, documents, talks)
    return [str(corpus)]


def chats() -> list[list[dict]]:
    """The calibration chats, as a calibration's `conversations`."""
    rows = [json.loads(line) for line in CHATS.read_text().splitlines()]
    return [row["messages"] for row in rows if "messages" in row]


def label_block(client: httpx.Client, folder: Path, tokens: int) -> int:
    """Register a block's transcoder as an SAE, calibrate it, label it by its top tokens and write
    its labels beside its weights; how many features it labelled."""
    sae = (
        client.post("/api/saes", json={"path": str(folder / "sae_weights.safetensors")})
        .raise_for_status()
        .json()["id"]
    )
    client.post(f"/api/saes/{sae}/attach", json={}).raise_for_status()
    body = {"conversations": chats(), "max_tokens": tokens, "top_examples": 20}
    job = client.post(f"/api/saes/{sae}/calibrate", json=body).raise_for_status().json()
    if finished(client, f"/api/jobs/{job['id']}")["state"] != "succeeded":
        raise SystemExit(f"{folder.name}: its calibration failed")
    done = client.post(f"/api/saes/{sae}/labels/top-tokens", json={}).raise_for_status().json()
    labels = client.get(f"/api/saes/{sae}/labels", params={"detail": "true"})
    labels = labels.raise_for_status().json()
    (folder / "sae_weights.labels.json").write_text(json.dumps(labels, ensure_ascii=False) + "\n")
    client.post(f"/api/saes/{sae}/detach").raise_for_status()
    client.delete(f"/api/saes/{sae}").raise_for_status()
    return done["imported"]


def in_float16(folder: Path) -> None:
    """Each block's weights stored in float16 (its cfg.json saying so)."""
    for block in sorted(folder.glob("layer_*")):
        weights = block / "sae_weights.safetensors"
        save_file({k: v.to(torch.float16) for k, v in load_file(weights).items()}, str(weights))
        cfg = json.loads((block / "cfg.json").read_text())
        cfg["dtype"] = "float16"
        (block / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n")


def ship(made: Path, out: Path, card: dict, view: dict) -> None:
    """The set, in float16, at `out` (replacing what was there), with its grade card."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(made, out)
    in_float16(out)
    files = sorted(out.glob("layer_*/sae_weights.safetensors"), key=lambda p: block_of(p.parent))
    card = {**card, "weights_id": content_id(files[0], *files[1:])}
    card["corpus"] = {**card["corpus"], "name": "corpus.jsonl (held-out windows)"}
    (out / "grade.json").write_text(json.dumps(card, indent=1) + "\n")
    training = {"request": view["request"], "timing": view["progress"]["timing"],
                "final": view["progress"]["curve"][-1]}  # fmt: skip
    (out / "training.json").write_text(json.dumps(training, indent=1) + "\n")
    (out / "README.md").write_text(readme(card, training, files))


def readme(card: dict, training: dict, files: list[Path]) -> str:
    """The set's README: what it is, how it was made (`training.json`), its grade card."""
    figures, asked, timing = card["figures"], training["request"], training["timing"]
    trained_on = training["final"]["tokens"]
    size = sum(f.stat().st_size for f in files) / 1e6
    f = figures
    summary = "\n".join(
        f"| {name} | {value} |"
        for name, value in [
            ("CE loss: model, replacement, every MLP zeroed (nats)",
             ", ".join(f"{f[k]:.3f}" for k in ("ce_loss_clean", "ce_loss_spliced",
                                                "ce_loss_zero_ablated"))),
            ("CE loss recovered", f"{f['ce_loss_recovered']:.3f}"),
            ("KL to the model (nats per token), KL score",
             f"{f['kl_spliced']:.3f}, {f['kl_score']:.3f}"),
            ("mean variance explained over the blocks",
             f"{f['mean_fraction_variance_explained']:.3f}"),
            ("mean L0, dead and dense fractions",
             f"{f['mean_l0']:.1f}, {f['mean_dead_fraction']:.3f}, {f['mean_dense_fraction']:.3f}"),
        ]
    )  # fmt: skip
    rows = "\n".join(
        f"| {b['block']} | {b['fraction_variance_explained']:.3f} | {b['l0']:.1f} | "
        f"{b['dead_fraction']:.3f} | {b['dense_fraction']:.3f} |"
        for b in figures["blocks"]
    )
    return f"""# smollm2-135m-jumprelu: millm's demo transcoder set

One transcoder per block ({len(files)}) of **SmolLM2-135M-Instruct**, each reading its block's MLP
input (the normalised residual, `mlp.hook_in`) and predicting what the MLP adds to the residual
(`mlp.hook_out`): SAELens JumpReLU transcoders (`layer_{{i}}/cfg.json` and
`sae_weights.safetensors`, {asked["d_sae"]} latents each, float16, {size:.1f} MB) under
circuit-tracer's `config.yaml`. With a transcoder on every block, millm's attribution graphs hold
attention and norms and give exact direct effects (docs/attribution.md). SAELens loads each block
(`JumpReLUTranscoder.load_from_disk("layer_3")`); circuit-tracer's own loader wants its layout
(`W_enc` as `[d_transcoder, d_model]`, `activation_function.threshold`), so it reads millm's
graph exports rather than these files.

## How it was made

By millm's own training job, as any user trains a set (docs/dictionaries.md), driven by
`scripts/build_demo_dictionaries.py` on a demo server (`--engine transformers`, 2 CPU cores):
`POST /api/saes/train` with `kind: transcoder_set`, SAELens's BatchTopK (k = {asked["k"]}, saved
as the JumpReLU it is at inference), batch {asked["batch_tokens"]:,}, lr {asked["lr"]},
{asked["epochs"]} epochs, {trained_on:,} tokens trained on, a latent dead after
{asked["dead_window_tokens"]:,} silent tokens (AuxK revives it). The corpus: the standard
library's docstrings and Debian's /usr/share/doc, spread through the demo SAE's calibration chats
(one JSONL file, every 20th window held out). Reading took {timing["read_s"]:.0f} s, the steps
{timing["train_s"]:.0f} s. The request as sent is in `training.json`.

Each block's labels (`layer_{{i}}/sae_weights.labels.json`) are its features' top tokens
(`POST /api/saes/{{id}}/labels/top-tokens`) on a calibration over the demo SAE's calibration
chats, the block's file attached as an SAE.

## Its grade card

`grade.json`, shown by `GET /api/transcoders/{{id}}/grades` (docs/dictionaries.md): graded on
{card["tokens"]:,} held-out tokens ({figures["texts"]} windows) the training never read. The
replacement model (every MLP replaced by its transcoder) against the model and against every
MLP zeroed:

| figure | value |
| --- | ---: |
{summary}

Each block alone, on the model's own MLP inputs: the variance of the MLP's output it explains,
its active latents per token, and the fractions of its latents that never fired (dead) and that
fired at over 10 % of the tokens (dense):

| block | variance explained | L0 | dead | dense |
| ---: | ---: | ---: | ---: | ---: |
{rows}

Rebuild: `.venv/bin/python scripts/build_demo_dictionaries.py` (about 40 minutes on 2 cores).
"""


def block_of(folder: Path) -> int:
    """A block's number from its folder's name, `layer_{i}`."""
    return int(folder.name.removeprefix("layer_"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=900_000, help="trained on, all epochs")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--label-tokens", type=int, default=12_000, help="read per block")
    parser.add_argument("--out", type=Path, default=SET_OUT)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="millm-demo-build-"))
    files = write_corpus(home, args.tokens, args.epochs)
    flags = ["--log-level", "warning", "--engine", "transformers"]
    server = ServerProcess(home, flags, allowed=[home]).wait_ready(600)
    began = time.monotonic()
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            source = {"files": files, "context_size": 128}
            body = {
                "kind": "transcoder_set", "name": "smollm2-135m-jumprelu", "d_sae": 320, "k": 16,
                "training_tokens": args.tokens, "batch_tokens": 2048, "lr": 2e-3,
                "epochs": args.epochs, "dead_window_tokens": 100_000, "corpus": source,
            }  # fmt: skip
            view, _ = trained(client, body)
            print(f"trained in {time.monotonic() - began:.0f} s", flush=True)
            set_id = view["result"]["transcoder_set_id"]
            grade = {"corpus": source, "part": "held_out", "max_tokens": GRADE_TOKENS}
            job = client.post(f"/api/transcoders/{set_id}/grade", json=grade).json()
            card = finished(client, f"/api/jobs/{job['id']}")["result"]
            print(
                json.dumps({k: v for k, v in card["figures"].items() if k != "blocks"}), flush=True
            )
            made = Path(view["result"]["path"])
            for block in sorted(made.glob("layer_*"), key=block_of):
                print(
                    block.name,
                    label_block(client, block, args.label_tokens),
                    "labelled",
                    flush=True,
                )
    finally:
        server.stop()
    ship(made, args.out, card, view)
    print(f"shipped to {args.out} in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
