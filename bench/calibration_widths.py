"""What calibrating an SAE costs by its width: tokens/s of a calibration job on the demo model.

One demo server. For each width, a random TopK SAE (k 32, d_in 576, layer 12, as the demo SAE
is shaped) is registered, attached alone, and calibrated on the demo corpus's texts and
conversations with a token budget (--tokens); tokens/s = tokens read / the job's wall time
(started -> finished, the figures' final pass included). A published SAE's width is the only
part of its cost that differs from these: its model's forward pass is the rest.

    .venv/bin/python bench/calibration_widths.py [--widths 2048,16384,65536] [--tokens 10000]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.kernel.model.shipped import DEMO_SAE  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402
from tests.support.tiny_saes import build_saelens, sae_tensors  # noqa: E402


def corpus() -> tuple[list[str], list[list[dict]]]:
    """The demo corpus: its texts and its conversations."""
    texts, conversations = [], []
    for line in (DEMO_SAE / "calibration_corpus.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "messages" in entry:
            conversations.append(entry["messages"])
        else:
            texts.append(entry["text"])
    return texts, conversations


def wait(client: httpx.Client, job_id: str) -> dict:
    while True:
        job = client.get(f"/api/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="2048,16384,65536")
    parser.add_argument("--tokens", type=int, default=10_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="millm-calwidth-"))
    server = ServerProcess(base / "home", [], allowed=[base]).wait_ready(600)
    texts, conversations = corpus()
    rows = []
    try:
        client = httpx.Client(base_url=server.base_url, timeout=600)
        for sae in client.get("/api/saes").json()["data"]:  # the demo SAE: calibrate alone
            if sae["attached"]:
                client.post(f"/api/saes/{sae['id']}/detach")
        for width in map(int, args.widths.split(",")):
            folder = build_saelens(
                base / f"w{width}",
                d_in=576,
                d_sae=width,
                layer=12,
                labels=False,
                tensors=sae_tensors(576, width, seed=width),
                config={"k": 32},
            )
            sae = client.post("/api/saes", json={"path": str(folder)}).json()["id"]
            assert client.post(f"/api/saes/{sae}/attach", json={}).status_code == 200
            body = {"texts": texts, "conversations": conversations, "max_tokens": args.tokens}
            started = client.post(f"/api/saes/{sae}/calibrate", json=body)
            assert started.status_code == 202, started.text
            job = wait(client, started.json()["id"])
            assert job["state"] == "succeeded", job
            summary = client.get(f"/api/saes/{sae}/calibration").json()["summary"]
            wall = job["finished_at"] - job["started_at"]
            rows.append(
                {
                    "width": width,
                    "tokens": summary["tokens"],
                    "wall_s": round(wall, 1),
                    "tokens_per_s": round(summary["tokens"] / wall, 1),
                    "s_per_million_tokens": round(wall / summary["tokens"] * 1e6),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            client.post(f"/api/saes/{sae}/detach")
    finally:
        server.stop()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    print(f"\n{cpu}, {args.tokens} tokens of the demo corpus, demo model (--dtype auto)\n")
    print("| width | tokens | wall s | tokens/s | s per 1M tokens |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['width']:,} | {row['tokens']:,} | {row['wall_s']} | {row['tokens_per_s']} "
            f"| {row['s_per_million_tokens']:,} |"
        )


if __name__ == "__main__":
    main()
