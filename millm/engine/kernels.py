"""Faster matrix-vector kernels for linear layers on the CPU, chosen once at load.

Decoding one token reads every weight once, so the kernel's bandwidth sets the speed: oneDNN
with a pre-packed (reordered) weight reads faster than MKL's default fp32 GEMV, bf16 faster
still, and PyTorch's int4 weight-only kernel over the GGUF file's own 4-bit codes fastest (the
figures, with the machine they were measured on, are in docs/engine.md).

Every kernel here is a function `x -> x @ W.T (+ b)`; modules keep their identity (names,
hooks), only their forward changes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

LinearFn = Callable[[torch.Tensor], torch.Tensor]
Q4_GROUP = 32
# Rows in one pass from which an int4 weight's bf16 copy runs it. The copy is faster from a few
# rows on (docs/engine.md), but below 256 a prefill takes a fraction of a second either way,
# and keeping those passes on the int4 kernel keeps short prompts' bf16 results exactly what they
# were (greedy bf16 text follows the kernel's rounding, and the docs print such text).
DENSE_ROWS = 256


def dense_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearFn:
    """The plain kernel (any device)."""
    return lambda x: F.linear(x, weight, bias)


@functools.cache
def prepack_supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN can pre-pack a weight of this dtype on this CPU: bf16 needs AVX-512 (BW, VL,
    DQ) or AVX-NE-CONVERT, which an AVX2-only CPU lacks; asked once by trying a tiny weight."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype))
    except RuntimeError:
        return False
    return True


def prepacked_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearFn:
    """oneDNN with the weight reordered once (CPU, fp32 or bf16); no batch-size hint, since rows vary."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    op = torch.ops.mkldnn._linear_pointwise
    return lambda x: op(x, packed, bias, "none", [], "")


def q4_1_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes, scale, minimum) if `weight` is exactly a dequantised Q4_1 tensor (blocks of 32), else None.

    Q4_1 stores w = m + d * q with q in 0..15 and, by construction, q = 0 at the block's minimum
    and q = 15 at its maximum, so d and m can be read back and must reproduce every value (to
    float rounding: a thousandth of a step; any other tensor misses by a quarter step on average).
    """
    out_features, in_features = weight.shape
    if in_features % Q4_GROUP:
        return None
    blocks = weight.detach().float().reshape(out_features, in_features // Q4_GROUP, Q4_GROUP)
    low, high = blocks.amin(-1), blocks.amax(-1)
    scale = (high - low) / 15
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = torch.round((blocks - low[..., None]) / safe[..., None])
    if codes.min() < 0 or codes.max() > 15:
        return None
    error = (low[..., None] + scale[..., None] * codes - blocks).abs()
    if bool((error > 1e-3 * scale[..., None] + 1e-12).any()):
        return None
    return codes.to(torch.int32).reshape(out_features, in_features), scale, low


def int4_linear(
    codes: torch.Tensor,
    scale: torch.Tensor,
    low: torch.Tensor,
    out_features: int,
    *,
    dense: bool = False,
) -> LinearFn:
    """PyTorch's CPU int4 weight-only kernel over Q4_1 codes (bf16 activations; bf16 block scales).

    The kernel computes w = (q - 8) * s + z per block, so s = d and z = m + 8d; its scales are
    bf16, which rounds the file's fp16 d and m slightly (the codes are the file's own).

    The kernel is built for decoding: it reads 4 bits a weight, but its matmul over many rows
    is slower than oneDNN's bf16 GEMM (docs/engine.md). With `dense`, those same
    weights (dequantised as the kernel does, rounded to bf16) are also kept pre-packed, 2 bytes a
    weight more, and a pass of DENSE_ROWS rows or more (a long prefill) runs on them.
    """
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    scales_and_zeros = (
        torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    )
    op = torch.ops.aten._weight_int4pack_mm_for_cpu
    wide = None
    if dense:
        step, zero = scales_and_zeros.float().unbind(-1)  # [groups, out] each
        blocks = codes.reshape(out_features, -1, Q4_GROUP).float() - 8
        weight = (
            (blocks * step.T[..., None] + zero.T[..., None])
            .reshape(out_features, -1)
            .to(torch.bfloat16)
        )
        wide = prepacked_linear(weight)

    def forward(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if wide is not None and flat.shape[0] >= DENSE_ROWS:
            return wide(x)
        return op(flat, packed, Q4_GROUP, scales_and_zeros).reshape(*shape[:-1], out_features)

    return forward


class KernelPlan:
    """Which kernel each linear weight gets on this device and dtype."""

    def __init__(self, device: torch.device, dtype: torch.dtype, int4: bool, fixed: bool = False):
        """`fixed`: the plain kernel for every weight (its results do not depend on the CPU kind)."""
        self.device = device
        self.dtype = dtype
        self.fixed = fixed
        self.int4 = int4 and device.type == "cpu" and dtype == torch.bfloat16 and not fixed
        self.counts = {"int4": 0, "prepacked": 0, "dense": 0}

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearFn:
        """A kernel for `weight` (given in its loaded precision; cast here to the compute dtype)."""
        if self.int4 and bias is None and (found := q4_1_codes(weight)) is not None:
            self.counts["int4"] += 1
            return int4_linear(*found, weight.shape[0], dense=prepack_supported(torch.bfloat16))
        weight = weight.detach().to(self.dtype)
        bias = None if bias is None else bias.detach().to(self.dtype)
        if (
            not self.fixed
            and self.device.type == "cpu"
            and self.dtype in (torch.float32, torch.bfloat16)
            and prepack_supported(self.dtype)
        ):
            self.counts["prepacked"] += 1
            return prepacked_linear(weight, bias)
        self.counts["dense"] += 1
        return dense_linear(weight, bias)

    @property
    def description(self) -> str:
        """e.g. 'int4 x210, prepacked x1' for logs and docs."""
        return ", ".join(f"{name} x{count}" for name, count in self.counts.items() if count)


def install_linear(module: torch.nn.Linear, fn: LinearFn) -> None:
    """Route a Linear module's forward through `fn`, keeping the module (and any hooks on it)."""
    module.forward = fn  # type: ignore[method-assign, assignment]  # an instance attribute shadows nn.Linear.forward on purpose
