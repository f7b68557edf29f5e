"""Packed against unpacked scoring lines in one batch each: the speed, and what packing changes.
One run, one table.

The script starts a real `millm serve` on the demo model (or --model PATH) with its own data
directory and makes --rows scoring lines (`/v1/completions`, `max_tokens: 1`, `logprobs: 5`,
prompts of 20 to 60 tokens that differ row to row, so packed passes pad). It runs them as one
batch with `pack: false` (each line one pass, equal to the synchronous route's answer) and as
one with `pack: true` (lines waiting together share padded passes of up to 16), timing each
from the create to `completed` with time.perf_counter() on the client, and compares every
line's answer: the top token (the decision a judge reads), and the largest difference of its
log-probability and of any of the 5 listed ones.

    .venv/bin/python bench/batch_packing.py [--rows 1000] [--model PATH]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.batch_throughput import WORDS, batch, output_lines  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def prompt(i: int) -> str:
    """4 to 16 words after a row number: prompts of different lengths, so packs pad."""
    picked = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(4 + i % 13)]
    return f"Row {i}: the " + " and the ".join(picked) + " were all that the traveller saw"


def run_batch(client: httpx.Client, model: str, rows: int, pack: bool) -> tuple[float, list]:
    """Seconds from create to completed, and the output lines in input order."""
    bodies = [
        {"model": model, "prompt": prompt(i), "max_tokens": 1, "logprobs": 5, "temperature": 0}
        for i in range(rows)
    ]
    seconds, ended = batch(client, bodies, pack=pack)
    assert ended["request_counts"]["completed"] == rows, ended
    return seconds, output_lines(client, ended)


def answer(line: dict) -> tuple[str, float, dict[str, float]]:
    """A scoring line's top token, its log-probability, and the 5 listed ones."""
    logprobs = line["response"]["body"]["choices"][0]["logprobs"]
    return logprobs["tokens"][0], logprobs["token_logprobs"][0], logprobs["top_logprobs"][0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        server = ServerProcess(
            Path(home), ["--model", str(args.model)] if args.model else [], allowed=[Path(home)]
        ).wait_ready()
        try:
            client = httpx.Client(base_url=server.base_url, timeout=600)
            model = client.get("/v1/models").json()["data"][0]["id"]
            run_batch(client, model, 64, True)  # warm-up
            single_s, single = run_batch(client, model, args.rows, False)
            packed_s, packed = run_batch(client, model, args.rows, True)
        finally:
            server.stop()
    changed, worst_top, worst_any = 0, 0.0, 0.0
    for one, many in zip(single, packed, strict=True):
        assert many["response"]["millm"]["packed"] and not one["response"]["millm"]["packed"]
        (token_a, lp_a, top_a), (token_b, lp_b, top_b) = answer(one), answer(many)
        changed += token_a != token_b
        worst_top = max(worst_top, abs(lp_a - lp_b))
        shared = top_a.keys() & top_b.keys()
        worst_any = max([worst_any, *(abs(top_a[t] - top_b[t]) for t in shared)])
    machine = platform.processor() or platform.machine()
    print(f"millm batch packing, {args.rows} scoring lines, {machine}")
    print("| | wall s | rows/s |")
    print("|---|---|---|")
    print(f"| pack: false | {single_s:.1f} | {args.rows / single_s:.1f} |")
    print(f"| pack: true | {packed_s:.1f} | {args.rows / packed_s:.1f} |")
    print(f"packed / single: {single_s / packed_s:.2f}x")
    print(f"top token changed by packing: {changed} of {args.rows} "
          f"({100 * changed / args.rows:.2f} %); largest |d logprob| of the top token "
          f"{worst_top:.4f}, of any listed token {worst_any:.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
