"""bench/gpu.py (decode speed on a GPU in one run) on the CPU with the tiny shape: it builds
its random Gemma 2 checkpoint, loads it through millm, and prints one row per stream count with
the five decode rates (unsteered, one feature, 8 steerings, SAE read on, transformers)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_bench_runs_on_the_cpu_with_the_tiny_shape(tiny_dirs):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu.py"),
            "--shape",
            "tiny",
            "--streams",
            "1,2",
            "--tokens",
            "4",
            "--tokenizer",
            str(tiny_dirs["tokenizer"]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", done.stdout, re.M)
    assert [int(streams) for streams, _ in rows] == [1, 2]
    for _, figures in rows:
        rates = [float(f) for f in figures.split(" | ")]
        assert len(rates) == 5 and all(rate > 0 for rate in rates)
