"""Decode speed with live monitoring off, and on watching 0, 16 and all features, in one run.

One demo server (the demo SAE attached at layer 12, 2048 features, TopK k=32); each mode is
set through PUT /api/monitoring, then the same greedy text completion is streamed --tokens
tokens long, --repeats times; decode tok/s excludes the first token, each figure is the best of
the repeats. Monitoring reads every position (`positions: all`, the heaviest setting), so each
step also copies its residual row off, and each finished request is encoded and recorded.

    .venv/bin/python bench/monitoring_speed.py [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Here is a list of the numbers from 1 to 300, separated by commas: 1, 2, 3,"
MODES = {
    "off": {"enabled": False},
    "on, 0 features": {"enabled": True, "features": [], "positions": "all"},
    "on, 16 features": {
        "enabled": True,
        "features": list(range(0, 2048, 128)),
        "positions": "all",
        "top_k": 16,
    },
    "on, all features (top 8)": {"enabled": True, "features": None, "positions": "all", "top_k": 8},
}


def decode_speed(base_url: str, tokens: int) -> float:
    """Streamed decode tok/s of one greedy completion, first token excluded."""
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = end = None
    used = 0
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if first is None and '"text":""' not in line:
                first = now
            if '"usage"' in line and '"completion_tokens"' in line:
                used = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
            end = now
    return (used - 1) / (end - first)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--home", type=Path, default=None, help="data directory (default: a temporary one)"
    )
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="millm-bench-"))

    server = ServerProcess(home, ["--log-level", "warning"]).wait_ready(timeout=600)
    results = {}
    try:
        decode_speed(server.base_url, 16)  # warm-up
        for _ in range(args.repeats):  # modes interleaved, so drift in the machine hits each alike
            for mode, settings in MODES.items():
                response = httpx.put(f"{server.base_url}/api/monitoring", json=settings, timeout=30)
                response.raise_for_status()
                results.setdefault(mode, []).append(decode_speed(server.base_url, args.tokens))
        stats = httpx.get(f"{server.base_url}/api/monitoring/stats", timeout=30).json()
    finally:
        server.stop()

    off = max(results["off"])
    print(
        f"\n{MODEL}, demo SAE (layer 12, 2048 features), {args.tokens} greedy tokens, positions: "
        f"all, best of {args.repeats}"
    )
    print("| monitoring | decode tok/s | vs off |")
    print("|---|---:|---:|")
    for mode, speeds in results.items():
        print(f"| {mode} | {max(speeds):.1f} | {max(speeds) / off:.3f} |")
    sixteen = max(results["on, 16 features"])
    print({m: [round(x, 1) for x in v] for m, v in results.items()})
    print(
        f"\n16 features: {100 * (1 - sixteen / off):.1f}% slower than off (goal <= 10%); "
        f"{stats['requests']} requests, {stats['positions_read']} positions recorded"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
