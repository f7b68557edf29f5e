"""Aggregate throughput and time to first token under concurrent streams: serial vs batched.

Starts the demo server twice on one data directory: once on the serial scheduler, once with
ENABLE_CONTINUOUS_BATCHING. At each concurrency level N, N streaming clients start at once,
each asking for --tokens greedy tokens of the same prompt; aggregate tok/s is every completion
token over the wall time from the first request to the last [DONE]; TTFT is per stream. Each
cell is the best of --repeats rounds (the machine may be shared).

    .venv/bin/python bench/concurrency.py [--tokens 64] [--repeats 2] [--levels 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Here is a list of the numbers from 1 to 300, separated by commas: 1, 2, 3,"


@dataclass
class Round:
    tok_s: float
    ttft_ms: list[float]
    tokens: int

    def percentile(self, q: float) -> float:
        """The q-th percentile of this round's TTFTs (nearest rank)."""
        ordered = sorted(self.ttft_ms)
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def one_stream(client: httpx.AsyncClient, tokens: int) -> tuple[float, int]:
    """One streamed completion: (time to first token s, completion tokens)."""
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first, used = None, 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                first = time.perf_counter() - start
            if chunk.get("usage"):
                used = chunk["usage"]["completion_tokens"]
    return first, used


async def one_round(base_url: str, streams: int, tokens: int) -> Round:
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one_stream(client, tokens) for _ in range(streams)))
        wall = time.perf_counter() - start
    total = sum(used for _, used in results)
    return Round(total / wall, [first * 1000 for first, _ in results], total)


def measure(base_url: str, levels: list[int], tokens: int, repeats: int) -> dict[int, Round]:
    asyncio.run(one_round(base_url, 2, 8))  # warm-up: kernels, the first batch shapes
    best = {}
    for level in levels:
        rounds = [asyncio.run(one_round(base_url, level, tokens)) for _ in range(repeats)]
        best[level] = max(rounds, key=lambda r: r.tok_s)
    return best


def serve(home: Path, batched: bool, max_batch: int) -> ServerProcess:
    env = {"ENABLE_CONTINUOUS_BATCHING": "1" if batched else "0", "MAX_BATCH_SIZE": str(max_batch)}
    return ServerProcess(home, ["--log-level", "warning"], env=env).wait_ready(timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument(
        "--home", type=Path, default=None, help="data directory (default: a temporary one)"
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    home = args.home or Path(tempfile.mkdtemp(prefix="millm-bench-"))

    results = {}
    for name, batched in (("serial", False), ("batched", True)):
        server = serve(home, batched, max(levels))
        try:
            backend = httpx.get(f"{server.base_url}/api/health/inference").json()["backend"]
            assert backend == name, f"expected the {name} backend, the server reports {backend}"
            results[name] = measure(server.base_url, levels, args.tokens, args.repeats)
        finally:
            server.stop()

    print(
        f"\n{MODEL} (demo, auto dtype), {args.tokens} greedy tokens per stream, best of "
        f"{args.repeats}"
    )
    print(
        "| streams | serial tok/s | batched tok/s | batched/serial | serial TTFT p50/p95 ms | "
        "batched TTFT p50/p95 ms |"
    )
    print(
        "|--------:|-------------:|--------------:|---------------:|-----------------------:|------------------------:|"
    )
    for level in levels:
        s, b = results["serial"][level], results["batched"][level]
        print(
            f"| {level:7d} | {s.tok_s:12.1f} | {b.tok_s:13.1f} | {b.tok_s / s.tok_s:13.2f}x | "
            f"{s.percentile(0.5):10.0f} / {s.percentile(0.95):<9.0f} | {b.percentile(0.5):10.0f} "
            f"/ {b.percentile(0.95):<10.0f} |"
        )
    single_off, single_on = results["serial"][levels[0]].tok_s, results["batched"][levels[0]].tok_s
    if 8 in results["batched"]:
        eight = results["batched"][8].tok_s
        print(
            "\nbatched aggregate at 8 streams / single stream (batching on) = "
            f"{eight / single_on:.2f}x (goal >= 4)"
        )
    print(f"single stream, batching on / off = {single_on / single_off:.2f} (goal >= 0.95)")
    print(
        "median TTFT, 1 stream: serial "
        f"{statistics.median(results['serial'][levels[0]].ttft_ms):.0f} ms, batched "
        f"{statistics.median(results['batched'][levels[0]].ttft_ms):.0f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
