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

import psutil
import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

LinearFn = Callable[[torch.Tensor], torch.Tensor]
Q4_GROUP = 32
# Rows in one pass from which an int4 weight's pre-packed copy runs it. A bf16 copy is faster from
# a few rows on (docs/engine.md), but it rounds the weights to bf16: below 256 a prefill takes a
# fraction of a second either way, and keeping those passes on the int4 kernel keeps short
# prompts' bf16 results what they were (greedy bf16 text follows the kernel's rounding). A
# float32 copy holds the very weights the int4 kernel computes with (its results differ from the
# kernel's by the order of accumulation, a unit in bf16's last place at most), and on an AVX2 CPU
# it is 1.6-1.8x faster from 32 rows on and slower below 8: from 64 rows, a text read through an
# SAE or a few scoring chats in one pass take it, not only long prefills.
DENSE_ROWS = 256
FLOAT32_COPY_ROWS = 64
# The share of the memory available at load that int4 weights' pre-packed copies may take: a
# copy is 2 (bf16) or 4 (float32) bytes a weight beside the 4-bit codes, so a large model keeps
# copies for its first layers only rather than running out of memory.
PREFILL_COPY_SHARE = 4


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
    """oneDNN with the weight reordered once (CPU, fp32 or bf16); no batch-size hint, since rows
    vary."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    op = torch.ops.mkldnn._linear_pointwise
    return lambda x: op(x, packed, bias, "none", [], "")


def q4_1_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes, scale, minimum) if `weight` is exactly a dequantised Q4_1 tensor (blocks of 32), else
    None.

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
    dense: torch.dtype | None = None,
) -> LinearFn:
    """PyTorch's CPU int4 weight-only kernel over Q4_1 codes (bf16 activations; bf16 block scales).

    The kernel computes w = (q - 8) * s + z per block, so s = d and z = m + 8d; its scales are
    bf16, which rounds the file's fp16 d and m slightly (the codes are the file's own).

    The kernel is built for decoding: it reads 4 bits a weight, but its matmul over many rows
    is 2-3x slower than oneDNN's GEMM (docs/engine.md). With `dense` (bfloat16 where oneDNN
    pre-packs it, else float32), those same weights, dequantised as the kernel does, are also
    kept pre-packed in that dtype, and a pass of DENSE_ROWS rows or more (a long prefill) runs on
    them, FLOAT32_COPY_ROWS for a float32 copy, which takes the bf16 activations widened and gives
    its result back in bf16.
    """
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    scales_and_zeros = (
        torch.stack([scale, low + 8 * scale], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    )
    op = torch.ops.aten._weight_int4pack_mm_for_cpu
    wide = None
    if dense is not None:
        step, zero = scales_and_zeros.float().unbind(-1)  # [groups, out] each
        blocks = codes.reshape(out_features, -1, Q4_GROUP).float() - 8
        weight = (
            (blocks * step.T[..., None] + zero.T[..., None]).reshape(out_features, -1).to(dense)
        )
        packed_copy = prepacked_linear(weight)
        wide = (
            packed_copy
            if dense == torch.bfloat16
            else lambda x: packed_copy(x.to(dense)).to(torch.bfloat16)
        )
    rows = DENSE_ROWS if dense == torch.bfloat16 else FLOAT32_COPY_ROWS

    def forward(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if wide is not None and flat.shape[0] >= rows:
            return wide(x)
        return op(flat, packed, Q4_GROUP, scales_and_zeros).reshape(*shape[:-1], out_features)

    return forward


class KernelPlan:
    """Which kernel each linear weight gets on this device and dtype."""

    def __init__(self, device: torch.device, dtype: torch.dtype, int4: bool, fixed: bool = False):
        """`fixed`: the plain kernel for every weight (its results do not depend on the CPU
        kind)."""
        self.device = device
        self.dtype = dtype
        self.fixed = fixed
        self.int4 = int4 and device.type == "cpu" and dtype == torch.bfloat16 and not fixed
        self.counts = {"int4": 0, "prepacked": 0, "dense": 0}
        self.copies = {"bf16 copy": 0, "fp32 copy": 0}  # int4 weights with a prefill copy
        # Decided once per plan: bytes the int4 weights' prefill copies may still take.
        self.copy_budget = prefill_copy_budget() if self.int4 else 0

    def _prefill_copy(self, weight: torch.Tensor) -> torch.dtype | None:
        """The dtype of an int4 weight's pre-packed prefill copy (bf16 where oneDNN pre-packs it,
        else float32), or None once the plan's copies would pass their memory budget."""
        dtype = torch.bfloat16 if prepack_supported(torch.bfloat16) else torch.float32
        cost = weight.numel() * dtype.itemsize
        if cost > self.copy_budget:
            return None
        self.copy_budget -= cost
        self.copies["bf16 copy" if dtype == torch.bfloat16 else "fp32 copy"] += 1
        return dtype

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearFn:
        """A kernel for `weight` (given in its loaded precision; cast here to the compute dtype)."""
        if self.int4 and bias is None and (found := q4_1_codes(weight)) is not None:
            self.counts["int4"] += 1
            return int4_linear(*found, weight.shape[0], dense=self._prefill_copy(weight))
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
        """e.g. 'int4 x210 (fp32 copy x210), prepacked x1' for logs and docs."""
        parts = [f"{name} x{count}" for name, count in self.counts.items() if count]
        copies = ", ".join(f"{name} x{count}" for name, count in self.copies.items() if count)
        if copies:
            parts[0] += f" ({copies})"
        return ", ".join(parts)


def prefill_copy_budget() -> int:
    """Bytes int4 weights' prefill copies may take: a share of the memory available now."""
    return int(psutil.virtual_memory().available) // PREFILL_COPY_SHARE


def install_linear(module: torch.nn.Linear, fn: LinearFn) -> None:
    """Route a Linear module's forward through `fn`, keeping the module (and any hooks on it)."""
    module.forward = fn  # type: ignore[method-assign, assignment]  # an instance attribute shadows nn.Linear.forward on purpose
