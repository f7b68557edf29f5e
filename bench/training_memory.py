"""A transcoder set's training on the demo model: the server's memory while it reads and trains.

The set of bench/transcoder_training.py (30 blocks x 320 latents, k = 16, batch 2,048) on fewer
tokens: `--read` tokens of bench/dictionary_training.py's corpus read once, then replayed for
`--epochs`. Every 10 s it prints the training's stage and steps beside the server's anonymous
resident memory (RssAnon: what the process itself holds, not the page cache of the epochs' file),
then the largest seen. A bounded training stays flat once its buffer is full, whatever the
corpus; memory that grows with the steps is held by something that should have let go.

    .venv/bin/python bench/training_memory.py [--read 12000] [--epochs 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dictionary_training import CHARS_PER_TOKEN, local_documents  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def anon_mib(pid: int) -> int:
    """A process's RssAnon, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--read", type=int, default=12_000, help="tokens read once")
    parser.add_argument("--epochs", type=int, default=16)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    corpus = home / "corpus.jsonl"
    documents = local_documents(int(args.read * 1.25 * CHARS_PER_TOKEN))
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    flags = ["--log-level", "warning", "--engine", "transformers"]
    server = ServerProcess(home, flags, allowed=[home]).wait_ready(600)
    peak = 0
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            pid = server.process.pid  # the forked or started server's own process
            body = {
                "kind": "transcoder_set", "d_sae": 320, "k": 16, "batch_tokens": 2048,
                "training_tokens": args.read // 2048 * 2048 * args.epochs, "lr": 2e-3,
                "epochs": args.epochs, "dead_window_tokens": 100_000,
                "corpus": {"files": [str(corpus)], "context_size": 128},
            }  # fmt: skip
            started = client.post("/api/saes/train", json=body).raise_for_status().json()
            while True:
                view = client.get(f"/api/saes/trainings/{started['id']}").json()
                now = anon_mib(pid)
                peak = max(peak, now)
                progress = view["progress"]
                print(
                    f"{progress['stage']:>16} step {progress['steps']:>4}  {now:>6} MiB", flush=True
                )
                if view["state"] != "running":
                    break
                time.sleep(10)
    finally:
        server.stop()
    print(f"{view['state']}; the largest: {peak} MiB")


if __name__ == "__main__":
    main()
