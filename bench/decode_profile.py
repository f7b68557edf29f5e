"""Where a decode step's time goes on the demo model: the lean runner's step alone (no scheduler),
one row, then the same steps under torch's profiler, grouped by what the time is spent on.

The profiler's self time of every op (the kernels' work plus their dispatch) set beside the step's
wall time leaves the Python between them: what a step compiled into one function would save.
The issue to make decode one compiled step (36) starts from these figures.

    .venv/bin/python bench/decode_profile.py [--steps 96] [--dtype auto]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_speed import PROMPT  # noqa: E402

from millm.engine.loader import load_model  # noqa: E402
from millm.engine.sources import demo_source  # noqa: E402

# What an op's time is spent on, by the op's name (the first group that matches).
GROUPS = (
    ("int4 matmuls (the body's linears)", ("int4pack",)),
    ("dense linears (the output layer, or the body when not int4)", ("linear", "addmm", "mm")),
    ("attention", ("attention",)),
    ("copies and casts", ("copy", "_to_copy", "empty", "as_strided", "slice", "view", "cat")),
    ("other small ops (norms, RoPE, residual adds, activations)", ("",)),
)


def group_of(name: str) -> str:
    """The GROUPS entry an op name falls in."""
    return next(label for label, keys in GROUPS if any(k in name for k in keys))


def steps(runner, prompt: list[int], count: int) -> tuple[list[float], object]:
    """Wall seconds of each of `count` greedy decode steps of one row, and the batch."""
    with torch.inference_mode():
        batch, logits = runner.prefill([prompt], capacity=len(prompt) + count + 8)
        token, times = int(logits[0].argmax()), []
        for _ in range(count):
            start = time.perf_counter()
            logits = runner.step(batch, torch.tensor([token]))
            token = int(logits[0].argmax())
            times.append(time.perf_counter() - start)
    return times, batch


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    lm = load_model(demo_source(), dtype=args.dtype, device="cpu", cache_root=home / "cache")
    runner = lm.runner
    prompt = lm.tokenizer(PROMPT)["input_ids"]
    steps(runner, prompt, 16)  # warm-up
    wall, _ = steps(runner, prompt, args.steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled, _ = steps(runner, prompt, 32)
    per_step = len(profiled)
    grouped: dict[str, float] = {}
    calls = 0
    for event in prof.key_averages():
        if not event.key.startswith("aten::") and not event.key.startswith("mkldnn::"):
            continue
        grouped[group_of(event.key)] = (
            grouped.get(group_of(event.key), 0.0) + event.self_cpu_time_total
        )
        calls += event.count
    ops = sum(grouped.values()) / 1e3 / per_step
    profiled_wall = sum(profiled) * 1e3 / per_step
    print(
        f"\nSmolLM2-135M-Instruct, {lm.dtype_name} ({runner.kernels}), one row, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"decode step: median {statistics.median(wall) * 1e3:.2f} ms "
        f"({1 / statistics.median(wall):.1f} tok/s) over {args.steps} steps"
    )
    print(
        f"under the profiler: {profiled_wall:.2f} ms a step, {calls / per_step:.0f} op calls a "
        "step\n"
    )
    print("| spent on | ms a step | share of the profiled step |")
    print("|---|---|---|")
    for label, _ in GROUPS:
        ms = grouped.get(label, 0.0) / 1e3 / per_step
        print(f"| {label} | {ms:.2f} | {ms / profiled_wall:.0%} |")
    rest = profiled_wall - ops
    print(
        f"| Python between ops (wall − the ops' own time) | {rest:.2f} | "
        f"{rest / profiled_wall:.0%} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
