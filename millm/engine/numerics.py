"""Reproducible CPU numerics: float32 results that are the same on every x86 CPU.

Greedy text follows the kernels' rounding, and which kernel runs depends on the CPU: ATen's
vectorised loops are built per instruction set (AVX-512, AVX2, plain), MKL's GEMM dispatches on
the CPU it finds, and oneDNN's pre-packed GEMM blocks by it. So the same bf16 (and, less often,
float32) request can answer differently on an AMD Zen 4, an AMD without AVX-512 and an Intel
Xeon. `--reproducible` fixes all three: ATen's portable loops (`ATEN_CPU_CAPABILITY=default`),
MKL's conditional-numerical-reproducibility branch (`MKL_CBWR=COMPATIBLE,STRICT`: the same code
on every CPU and thread count) and no oneDNN (linears are plain float32 `F.linear`, which is
MKL's). Measured on one machine under every ISA cap torch, oneDNN and MKL honour: logits equal
bit for bit (docs/testing.md, tests/acceptance/test_cpu_kinds.py).
"""

from __future__ import annotations

import os

FIXED_ENVIRONMENT = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE,STRICT"}


def fix_cpu_numerics() -> None:
    """Pin ATen and MKL to CPU-independent code paths; must run before torch's first operation."""
    os.environ.update(FIXED_ENVIRONMENT)
    import torch

    # ATen reads the variable once, at the first dispatch; after that the CPU's own capability
    # stays.
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "DEFAULT":
        raise RuntimeError(
            "reproducible numerics must be fixed before torch's first operation (ATen already "
            f"runs {capability} code)"
        )
