"""Calibration throughput on the demo corpus, and a chat stream's decode speed alone vs while a
calibration runs.

One demo server per scheduler policy (serial, the default; and continuous batching), each with
its default settings otherwise (MILLM_JOB_SHARE 0.25 unless --share). In each:

1. calibration alone: POST /api/saes/sae_262743630f92/calibrate {"corpus": "demo"} with nothing
   else running; tokens/s = the corpus's tokens / the job's wall time (started -> finished);
2. --repeats pairs, back to back: a greedy streamed chat completion (--tokens tokens) alone, then
   the same stream while a calibration runs (started just before, past its first texts, and
   cancelled after). Pairing keeps the two sides of each ratio seconds apart, so a machine
   that gets busier or quieter during the run (it is shared) moves both alike.

Decode tok/s excludes the first token; time to first token is reported too, and the
calibration's own progress during the busy streams (tokens/s). Figures are medians; the ratio
is the median of the pairs' ratios. The goal: decode while calibrating >= 0.7x alone.

    .venv/bin/python bench/calibration_speed.py [--tokens 128] [--repeats 7]
        [--policies serial,batched] [--share 0.25] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
SAE = "sae_262743630f92"
SETTLE_S = (
    2.0  # after a cancel, the engine call in flight ends before the next "alone" stream starts
)
MESSAGES = [
    {"role": "user", "content": "Count from 1 to 300, separated by commas, and say nothing else."}
]


def stream_chat(base_url: str, tokens: int) -> tuple[float, float]:
    """(decode tok/s with the first token excluded, time to first token in s) of one greedy chat
    stream."""
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first = end = None
    used = 0
    with httpx.stream(
        "POST", f"{base_url}/v1/chat/completions", json=body, timeout=600
    ) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            now = time.perf_counter()
            if chunk.get("usage"):
                used = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or now
                end = now
    assert first is not None and end is not None and used > 1, "the stream produced no tokens"
    return (used - 1) / (end - first), first - sent


def job(base_url: str, job_id: str) -> dict:
    return httpx.get(f"{base_url}/api/jobs/{job_id}", timeout=30).json()


def start_calibration(base_url: str) -> str:
    response = httpx.post(
        f"{base_url}/api/saes/{SAE}/calibrate", json={"corpus": "demo"}, timeout=300
    )
    response.raise_for_status()
    return response.json()["id"]


def calibration_alone(base_url: str) -> dict:
    """Run a whole calibration with nothing else running; its tokens/s."""
    job_id = start_calibration(base_url)
    while (state := job(base_url, job_id))["state"] == "running":
        time.sleep(1)
    assert state["state"] == "succeeded", state
    wall = state["finished_at"] - state["started_at"]
    summary = state["result"]
    return {
        "tokens": summary["tokens"],
        "texts": summary["texts"],
        "wall_s": wall,
        "tokens_per_s": summary["tokens"] / wall,
    }


def stream_while_calibrating(
    base_url: str, tokens: int, tokens_per_text: float
) -> tuple[float, float, float]:
    """One stream while a calibration runs: (decode tok/s, time to first token, the calibration's
    tokens/s meanwhile)."""
    job_id = start_calibration(base_url)
    while job(base_url, job_id)["progress"]["done"] < 3:
        time.sleep(0.1)
    before, began = job(base_url, job_id)["progress"]["done"], time.monotonic()
    speed, ttft = stream_chat(base_url, tokens)
    state = job(base_url, job_id)
    rate = (state["progress"]["done"] - before) / (time.monotonic() - began) * tokens_per_text
    httpx.delete(f"{base_url}/api/jobs/{job_id}", timeout=30)
    while job(base_url, job_id)["state"] == "running":
        time.sleep(0.1)
    time.sleep(SETTLE_S)
    assert state["state"] == "running", "the calibration ended before the stream did"
    return speed, ttft, rate


def run_policy(policy: str, args) -> dict:
    env = {"MILLM_JOB_SHARE": str(args.share)}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    if policy == "batched":
        env["ENABLE_CONTINUOUS_BATCHING"] = "true"
    home = Path(tempfile.mkdtemp(prefix=f"millm-bench-cal-{policy}-"))
    server = ServerProcess(home, ["--log-level", "warning"], env=env).wait_ready(timeout=900)
    try:
        stream_chat(server.base_url, 16)  # warm-up
        calibration = calibration_alone(server.base_url)
        tokens_per_text = calibration["tokens"] / calibration["texts"]
        pairs = []
        for _ in range(args.repeats):
            alone = stream_chat(server.base_url, args.tokens)
            busy = stream_while_calibrating(server.base_url, args.tokens, tokens_per_text)
            pairs.append((alone, busy))
    finally:
        server.stop()
    return {
        "policy": policy,
        "calibration": calibration,
        "decode_alone": statistics.median(a[0] for a, _ in pairs),
        "ttft_alone": statistics.median(a[1] for a, _ in pairs),
        "decode_busy": statistics.median(b[0] for _, b in pairs),
        "ttft_busy": statistics.median(b[1] for _, b in pairs),
        "ratio": statistics.median(b[0] / a[0] for a, b in pairs),
        "calibration_busy_tokens_per_s": statistics.median(b[2] for _, b in pairs),
        "pairs": [[[round(x, 3) for x in a], [round(x, 3) for x in b]] for a, b in pairs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--policies", default="serial,batched")
    parser.add_argument("--share", type=float, default=0.25, help="MILLM_JOB_SHARE")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of the servers (default: torch's own)",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = [run_policy(policy, args) for policy in args.policies.split(",")]
    load_after = os.getloadavg()[0]

    print(
        f"\n{MODEL}, demo SAE {SAE} (layer 12), demo corpus; chat stream of {args.tokens} greedy "
        f"tokens, median of {args.repeats} pairs; MILLM_JOB_SHARE {args.share}; OMP_NUM_THREADS "
        f"{args.threads or 'default'}; load average {load_before:.1f} -> {load_after:.1f}"
    )
    print(
        "| policy | calibration alone tok/s (tokens, s) | decode alone tok/s | decode while "
        "calibrating tok/s | ratio | TTFT alone / busy s | calibration while streaming tok/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r["calibration"]
        print(
            f"| {r['policy']} | {c['tokens_per_s']:.0f} ({c['tokens']}, {c['wall_s']:.0f}) | "
            f"{r['decode_alone']:.1f} | {r['decode_busy']:.1f} | {r['ratio']:.2f} | "
            f"{r['ttft_alone']:.2f} / {r['ttft_busy']:.2f} | "
            f"{r['calibration_busy_tokens_per_s']:.0f} |"
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
