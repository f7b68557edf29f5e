"""What reporting log-probabilities while generating costs in decode speed. One run, one table.

The script starts a real `millm serve` on the demo model (no --model; or --model PATH) with its
own data directory and sends --requests rounds of greedy chat completions of --tokens tokens,
each round one request per variant in rotating order: no logprobs, `logprobs: true` (the drawn
token only), `logprobs: true, top_logprobs: 5` and `top_logprobs: 20`. Every variant must give
the same text (greedy; the logprobs are read beside the draw, never change it). Timed on the
client with time.perf_counter() from sending to the whole body; tok/s is completion_tokens
over that time. The per-token work measured is a log-softmax over the vocabulary, a top-k and
turning the numbers into Python and JSON (the scheduler thread computes them beside the draw).

    .venv/bin/python bench/logprobs_cost.py [--requests 8] [--tokens 64] [--model PATH]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

QUESTION = "Describe, in several sentences, how a river shapes the land it crosses."
VARIANTS = {
    "no logprobs": {},
    "logprobs": {"logprobs": True},
    "top_logprobs 5": {"logprobs": True, "top_logprobs": 5},
    "top_logprobs 20": {"logprobs": True, "top_logprobs": 20},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="millm-bench-logprobs-"))
    server = ServerProcess(home, ["--model", args.model] if args.model else [], fork=False)
    server.wait_ready(timeout=900)
    try:
        client = httpx.Client(base_url=server.base_url, timeout=600)
        model = client.get("/v1/models").json()["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": args.tokens,
            "temperature": 0,
        }
        client.post("/v1/chat/completions", json=body).raise_for_status()  # warm
        speeds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        texts: dict[str, set[str]] = {name: set() for name in VARIANTS}
        names = list(VARIANTS)
        for round_ in range(args.requests):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                began = time.perf_counter()
                response = client.post("/v1/chat/completions", json={**body, **VARIANTS[name]})
                seconds = time.perf_counter() - began
                response.raise_for_status()
                answer = response.json()
                speeds[name].append(answer["usage"]["completion_tokens"] / seconds)
                texts[name].add(answer["choices"][0]["message"]["content"])
        assert len(set.union(*texts.values())) == 1, "greedy variants gave different texts"
        base = statistics.median(speeds["no logprobs"])
        print(
            f"{platform.processor() or platform.machine()}, {args.requests} rounds, {args.tokens} "
            "tokens"
        )
        print("| variant | tok/s p50 | tok/s min | vs no logprobs |")
        print("|---|---|---|---|")
        for name, values in speeds.items():
            median = statistics.median(values)
            print(
                f"| {name} | {median:.1f} | {min(values):.1f} | {100 * (median / base - 1):+.1f}% |"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
