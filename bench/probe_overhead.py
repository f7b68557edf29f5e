"""Decode speed with and without watches on the demo model, at 1 and 8 rows (goal: ratio >= 0.9).

A watched row carries two watches at the demo SAE's layer: a `report` watch and a `steer`
watch (8 SAE features at strength 4 once it fires). Both score the residual with a linear
probe (`h · w + b`, w a unit SAE decoder direction), the shape of a logistic-regression probe
before its sigmoid. The steer watch's threshold is the median score of an unwatched run's
completion, so it fires partway through and its row restacks once; the report watch's is the
75th percentile. Runs alternate (plain, watched, plain, ...) so drift on a shared machine
hits both alike; the table gives the best and median decode tok/s of each (all rows together,
each row's first token excluded). It also times one watch's work on one decode position alone
(score, read back, record), which a busy machine disturbs less than a whole run.

    .venv/bin/python bench/probe_overhead.py [--tokens 128] [--repeats 5] [--dtype auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_speed import PROMPT  # noqa: E402
from steering_speed import demo_model_and_sae  # noqa: E402

from millm.engine.generate import run_job  # noqa: E402
from millm.engine.jobs import (  # noqa: E402
    GenerationJob,
    ResidualRead,
    ResidualsRead,
    RowFinished,
    RowSpec,
    TextDelta,
    Watch,
)
from millm.engine.sampling import SamplingParams  # noqa: E402
from millm.engine.watching import WatchState  # noqa: E402
from millm.interp.steering import Attached, steering_edit  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


class Probe:
    """A linear score of the residual, `h · w + b`."""

    def __init__(self, w: torch.Tensor, b: float):
        self.w, self.b = w, b

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.w + self.b


def decode_rate(lm, spec: RowSpec, rows: int) -> float:
    """Decode tok/s of `rows` copies of `spec` run as one job (each row's first token excluded)."""
    marks: list[float] = []
    counts: list[int] = []

    def emit(event):
        if isinstance(event, TextDelta) and not marks:
            marks.append(time.perf_counter())
        elif isinstance(event, RowFinished):
            counts.append(event.completion_tokens)
            if len(counts) == rows:
                marks.append(time.perf_counter())

    run_job(lm, GenerationJob(rows=[spec] * rows, emit=emit))
    return sum(c - 1 for c in counts) / (marks[-1] - marks[0])


def scoring_cost(lm, watch: Watch) -> float:
    """Microseconds one watch spends on one decode position (score, read back, record), best of 5
    x 1000."""
    state = WatchState(watch, 1)
    hidden = torch.randn(1, lm.model.config.hidden_size).to(lm.device, lm.model.dtype)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for position in range(1000):
            state.take(position, hidden)
        best = min(best, (time.perf_counter() - start) / 1000 * 1e6)
    return best


def completion_scores(lm, spec: RowSpec, point: int, probe: Probe) -> torch.Tensor:
    """The probe's scores over an unwatched run's completion."""
    captured = []
    reading = replace(spec, reads=(ResidualRead(point, False, "completion", "bench"),))
    run_job(
        lm,
        GenerationJob(
            rows=[reading],
            emit=lambda e: captured.append(e) if isinstance(e, ResidualsRead) else None,
        ),
    )
    return probe(captured[0].residuals.to(lm.device, lm.model.dtype).float())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()

    lm, info, sae = demo_model_and_sae(args.dtype)
    point = info.layer
    edit = steering_edit(
        {info.id: {i: 4.0 for i in range(8)}}, {info.id: Attached(info, sae, point)}
    )
    direction = sae.W_dec[100].float()
    probe = Probe((direction / direction.norm()).to(lm.device), 0.5)
    prompt_ids = tuple(lm.tokenizer(PROMPT)["input_ids"])
    plain = RowSpec(prompt_ids=prompt_ids, sampling=GREEDY, max_tokens=args.tokens)
    scores = completion_scores(lm, plain, point, probe)
    report = Watch("report", point, probe, float(scores.quantile(0.75)))
    steer = Watch("steer", point, probe, float(scores.median()), "steer", edit=edit)
    watched = replace(plain, watches=(report, steer))

    load_before = os.getloadavg()[0]
    table = []
    for rows in (1, 8):
        decode_rate(lm, replace(plain, max_tokens=16), rows)
        decode_rate(lm, replace(watched, max_tokens=16), rows)
        bare, probed = [], []
        for _ in range(args.repeats):
            bare.append(decode_rate(lm, plain, rows))
            probed.append(decode_rate(lm, watched, rows))
        table.append((rows, bare, probed))

    print(
        f"\nSmolLM2-135M-Instruct, {lm.dtype_name} ({lm.runner.kernels}), {args.tokens} greedy "
        f"tokens per row, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.repeats} alternating runs, load average {load_before:.2f} -> "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(
        "| rows | no watch best / median tok/s | report + steer watch best / median tok/s | "
        "watched / plain (medians) |"
    )
    print("|---|---|---|---|")
    for rows, bare, probed in table:
        ratio = statistics.median(probed) / statistics.median(bare)
        print(
            f"| {rows} | {max(bare):.1f} / {statistics.median(bare):.1f} | {max(probed):.1f} / "
            f"{statistics.median(probed):.1f} | {ratio:.3f} |"
        )
    print(
        f"\none watch on one decode position: {scoring_cost(lm, report):.1f} µs (best of 5 x 1000)"
    )
    print("(goal >= 0.9)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
