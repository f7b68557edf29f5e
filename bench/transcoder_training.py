"""Training a transcoder set on the demo model, against the shipped demo set, in one run.

The shipped set (`millm/demo/transcoders/smollm2-135m-jumprelu`: 320 latents a block, k = 16;
until 2026-12-07 a hand-written loop over EleutherAI sparsify's coder, since then made by this
same job through scripts/build_demo_dictionaries.py) against one trained by
`POST /api/saes/train` (`kind: transcoder_set`, BatchTopK on SAELens's machinery) with the same
width, k and batch, both graded by `POST /api/transcoders/{id}/grade` on the same held-out
windows: each block's variance explained, L0 and dead fraction, and the replacement model (every
MLP replaced) against the model and every MLP zeroed.

The corpus is bench/dictionary_training.py's (text already on the machine, one JSONL file). The
training's own timing says how fast it read activations (a pass reading every block's MLP input
and re-running its MLP in float32) and how long the SAELens steps of the 30 blocks took.

    .venv/bin/python bench/transcoder_training.py [--tokens 2000000] [--epochs 8] [--lr 0.002]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dictionary_training import (  # noqa: E402
    corpus_server,
    finished,
    trained,
    training_arguments,
)

SHIPPED = "smollm2-135m-jumprelu"


def summary(card: dict) -> dict:
    """A set card's figures without the per-block list, and its blocks' variance explained."""
    figures = dict(card["figures"])
    blocks = figures.pop("blocks")
    figures["fve_by_block"] = [round(b["fraction_variance_explained"], 3) for b in blocks]
    return figures


def main() -> None:
    parser = training_arguments(__doc__, batch=2048)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--skip", action="store_true", help="a skip connection per block")
    parser.add_argument("--dead-window", type=int, default=100_000, help="tokens (the shipped's)")
    args = parser.parse_args()
    corpus, _, server = corpus_server(args.tokens, args.epochs, args.engine)
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            sets = client.get("/api/transcoders").json()["data"]
            (shipped,) = [s["id"] for s in sets if s["path"].endswith(SHIPPED)]
            source = {"files": [str(corpus)], "context_size": 128}
            held_out = {"corpus": source, "part": "held_out", "max_tokens": 8192}

            def grade(set_id: str) -> dict:
                job = client.post(f"/api/transcoders/{set_id}/grade", json=held_out).json()
                return finished(client, f"/api/jobs/{job['id']}")["result"]

            shipped_card = grade(shipped)
            body = {
                "kind": "transcoder_set", "d_sae": args.width, "k": args.k, "skip": args.skip,
                "training_tokens": args.tokens, "batch_tokens": args.batch, "lr": args.lr,
                "epochs": args.epochs, "dead_window_tokens": args.dead_window, "corpus": source,
            }  # fmt: skip
            view, wall = trained(client, body)
            trained_card = grade(view["result"]["transcoder_set_id"])
    finally:
        server.stop()
    timing = view["progress"]["timing"]
    result = {
        "engine": args.engine,
        "activations_read": view["progress"]["rows_read"],
        "epochs": args.epochs,
        "tokens_trained": view["progress"]["tokens"],
        "steps": view["progress"]["steps"],
        "wall_s": round(wall, 1),
        "read_s": timing["read_s"],
        "train_s": timing["train_s"],
        "read_tokens_per_s": round(timing["tokens_read"] / timing["read_s"]),
        "trained": summary(trained_card),
        "shipped": summary(shipped_card),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
