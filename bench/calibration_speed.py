"""Calibration throughput on the demo corpus, and a chat stream's decode speed alone vs while a calibration runs.

One demo server per scheduler policy (serial, the default; and continuous batching), each with
its default settings otherwise (MILLM_JOB_SHARE 0.25 unless --share). In each:

1. decode alone: a greedy streamed chat completion (--tokens tokens), --repeats times; decode
   tok/s excludes the first token, time to first token is reported too;
2. calibration alone: POST /api/saes/sae_dd8838d57250/calibrate {"corpus": "demo"} with nothing
   else running; tokens/s = the corpus's tokens / the job's wall time (started -> finished);
3. decode while a calibration runs: a new calibration is started and, once it has done its
   first texts, the same streams run back to back; the job's progress during them is recorded
   (texts/s), then the job is cancelled.

The figures are medians of the repeats. The goal: decode while calibrating >= 0.7x alone.

    .venv/bin/python bench/calibration_speed.py [--tokens 128] [--repeats 5] [--policies serial,batched] [--share 0.25]
"""

from __future__ import annotations

import argparse
import json
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
SAE = "sae_dd8838d57250"
MESSAGES = [{"role": "user", "content": "Count from 1 to 300, separated by commas, and say nothing else."}]


def stream_chat(base_url: str, tokens: int) -> tuple[float, float]:
    """(decode tok/s with the first token excluded, time to first token in s) of one greedy chat stream."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = end = None
    used = 0
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
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
    response = httpx.post(f"{base_url}/api/saes/{SAE}/calibrate", json={"corpus": "demo"}, timeout=300)
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
    return {"tokens": summary["tokens"], "texts": summary["texts"], "wall_s": wall, "tokens_per_s": summary["tokens"] / wall}


def decode_alone(base_url: str, tokens: int, repeats: int) -> list[tuple[float, float]]:
    return [stream_chat(base_url, tokens) for _ in range(repeats)]


def decode_while_calibrating(base_url: str, tokens: int, repeats: int) -> tuple[list[tuple[float, float]], float]:
    """Streams while a calibration runs; also the job's texts/s over the streams."""
    job_id = start_calibration(base_url)
    while job(base_url, job_id)["progress"]["done"] < 5:
        time.sleep(0.2)
    before, began = job(base_url, job_id)["progress"]["done"], time.monotonic()
    results = [stream_chat(base_url, tokens) for _ in range(repeats)]
    state = job(base_url, job_id)
    rate = (state["progress"]["done"] - before) / (time.monotonic() - began)
    ran_throughout = state["state"] == "running"
    httpx.delete(f"{base_url}/api/jobs/{job_id}", timeout=30)
    while job(base_url, job_id)["state"] == "running":
        time.sleep(0.2)
    assert ran_throughout, "the calibration ended before the streams did: use fewer --repeats or --tokens"
    return results, rate


def run_policy(policy: str, args) -> dict:
    env = {"MILLM_JOB_SHARE": str(args.share)}
    if policy == "batched":
        env["ENABLE_CONTINUOUS_BATCHING"] = "true"
    home = Path(tempfile.mkdtemp(prefix=f"millm-bench-cal-{policy}-"))
    server = ServerProcess(home, ["--log-level", "warning"], env=env).wait_ready(timeout=900)
    try:
        stream_chat(server.base_url, 16)  # warm-up
        alone = decode_alone(server.base_url, args.tokens, args.repeats)
        calibration = calibration_alone(server.base_url)
        busy, rate = decode_while_calibrating(server.base_url, args.tokens, args.repeats)
    finally:
        server.stop()
    texts_per_token = calibration["texts"] / calibration["tokens"]
    return {
        "policy": policy,
        "calibration": calibration,
        "decode_alone": statistics.median(s for s, _ in alone),
        "ttft_alone": statistics.median(t for _, t in alone),
        "decode_busy": statistics.median(s for s, _ in busy),
        "ttft_busy": statistics.median(t for _, t in busy),
        "calibration_busy_tokens_per_s": rate / texts_per_token,
        "raw": {"alone": alone, "busy": busy},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policies", default="serial,batched")
    parser.add_argument("--share", type=float, default=0.25, help="MILLM_JOB_SHARE")
    args = parser.parse_args()
    rows = [run_policy(policy, args) for policy in args.policies.split(",")]

    print(f"\n{MODEL}, demo SAE {SAE} (layer 12), demo corpus; chat stream of {args.tokens} greedy tokens, "
          f"median of {args.repeats}; MILLM_JOB_SHARE {args.share}")
    print("| policy | calibration alone tok/s (tokens, s) | decode alone tok/s | decode while calibrating tok/s | ratio | TTFT alone / busy s | calibration while streaming tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r["calibration"]
        print(f"| {r['policy']} | {c['tokens_per_s']:.0f} ({c['tokens']}, {c['wall_s']:.0f}) | {r['decode_alone']:.1f} | {r['decode_busy']:.1f} | "
              f"{r['decode_busy'] / r['decode_alone']:.2f} | {r['ttft_alone']:.2f} / {r['ttft_busy']:.2f} | {r['calibration_busy_tokens_per_s']:.0f} |")
    print(json.dumps([{k: v for k, v in r.items() if k != "raw"} | {"raw": {k: [[round(x, 3) for x in p] for p in v] for k, v in r["raw"].items()}}
                      for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
