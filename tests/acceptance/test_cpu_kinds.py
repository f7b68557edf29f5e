"""No test depends on the CPU kind (docs/testing.md), tried on this one machine: a representative
slice of the acceptance tier (the demo's answer, its steering, docs examples, the reproducible
example's exact text) runs in a subprocess under the instruction-set caps that torch, oneDNN and
MKL honour, as it would on an AMD without AVX-512. Its servers inherit the caps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
# What an AVX2-only x86 CPU runs: ATen's AVX2 loops, oneDNN's and MKL's AVX2 kernels (no AVX-512, no
# bf16 dot products).
AVX2_ONLY = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
DOCS = "tests/acceptance/test_docs_examples.py::test_example_runs_and_keeps_its_promises"
SLICE = [
    "tests/acceptance/test_demo_model.py::test_capital_of_france",
    "tests/acceptance/test_demo_steering.py",
    *(
        f"{DOCS}[{example}]"
        for example in (
            "README.md-3-python",
            "agents.md-0-python",
            "activations.md-2-python",
            "compare.md-1-python",  # compare
            "serving.md-2-python",
        )
    ),
]


def test_a_representative_slice_passes_on_an_avx2_only_cpu(tmp_path):
    import torch

    if torch.backends.cpu.get_cpu_capability() == "AVX2":
        pytest.skip("this CPU has no AVX-512: every test of this run is the slice, uncapped")
    environment = {**os.environ, **AVX2_ONLY}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(tmp_path / "run"),
        *SLICE,
    ]
    result = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    # test_demo_steering.py holds 6 tests
    assert f"{len(SLICE) + 5} passed" in result.stdout, result.stdout[-2000:]
