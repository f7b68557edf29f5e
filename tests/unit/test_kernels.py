"""CPU linear kernels against F.linear, and exact recovery of Q4_1 codes."""

import pytest
import torch
import torch.nn.functional as F

from millm.engine.kernels import (
    DENSE_ROWS,
    FLOAT32_COPY_ROWS,
    KernelPlan,
    int4_linear,
    prepack_supported,
    prepacked_linear,
    q4_1_codes,
)


def q4_1_weight(out_features=64, in_features=128, seed=0):
    """A weight that is exactly what dequantising a Q4_1 tensor gives: m + d * q per block of 32."""
    generator = torch.Generator().manual_seed(seed)
    blocks = in_features // 32
    codes = torch.randint(0, 16, (out_features, blocks, 32), generator=generator)
    codes[..., 0], codes[..., 1] = 0, 15  # Q4_1 puts the block's minimum at 0 and maximum at 15
    d = (torch.rand(out_features, blocks, 1, generator=generator) * 0.01 + 0.001).half().float()
    m = (torch.randn(out_features, blocks, 1, generator=generator) * 0.05).half().float()
    return (m + d * codes).reshape(out_features, in_features), codes.reshape(
        out_features, in_features
    )


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, 3])
def test_prepacked_equals_dense(dtype, tolerance, rows):
    if not prepack_supported(dtype):
        pytest.skip(f"oneDNN cannot pre-pack {dtype} on this CPU (the plan falls back to dense)")
    weight = torch.randn(96, 64, dtype=dtype)
    bias = torch.randn(96, dtype=dtype)
    x = torch.randn(rows, 5, 64, dtype=dtype)
    got = prepacked_linear(weight, bias)(x)
    assert got.shape == (rows, 5, 96)
    assert torch.allclose(
        got.float(), F.linear(x, weight, bias).float(), atol=tolerance, rtol=tolerance
    )


def test_q4_1_codes_are_recovered_exactly():
    weight, codes = q4_1_weight()
    found = q4_1_codes(weight)
    assert found is not None
    recovered, scale, low = found
    assert torch.equal(recovered, codes.to(torch.int32))
    blocks = recovered.reshape(64, 4, 32).float()
    assert torch.equal(low[..., None] + scale[..., None] * blocks, weight.reshape(64, 4, 32))


@pytest.mark.parametrize("make", [lambda: torch.randn(64, 128), lambda: torch.randn(64, 100)])
def test_non_q4_weights_are_not_taken_for_codes(make):
    assert q4_1_codes(make()) is None


def test_int4_kernel_matches_the_dequantised_weight():
    weight, _ = q4_1_weight()
    x = torch.randn(2, 3, 128)
    got = int4_linear(*q4_1_codes(weight), 64)(x.to(torch.bfloat16)).float()
    want = F.linear(x, weight)
    # bf16 activations and bf16 block scales: agreement to bf16 precision.
    assert torch.allclose(got, want, atol=0.05 * want.abs().max().item(), rtol=0.02)


def test_plan_takes_int4_only_for_q4_weights_in_bfloat16():
    weight, _ = q4_1_weight()
    plan = KernelPlan(torch.device("cpu"), torch.bfloat16, int4=True)
    plan.linear(weight)
    plan.linear(torch.randn(64, 128))
    # bf16 pre-packing needs AVX-512 or AVX-NE-CONVERT; elsewhere the plan falls back to dense.
    packed = prepack_supported(torch.bfloat16)
    assert plan.counts == {"int4": 1, "prepacked": int(packed), "dense": int(not packed)}
    fp32 = KernelPlan(torch.device("cpu"), torch.float32, int4=True)
    fp32.linear(weight)
    assert fp32.counts["int4"] == 0 and fp32.description == "prepacked x1"


@pytest.mark.parametrize("copy", [torch.bfloat16, torch.float32])
def test_a_wide_pass_runs_on_a_pre_packed_copy_of_the_int4_weights(copy):
    if not prepack_supported(copy):
        pytest.skip("bf16 pre-packing needs AVX-512 or AVX-NE-CONVERT")
    weight, _ = q4_1_weight()
    codes = q4_1_codes(weight)
    plain, dense = int4_linear(*codes, 64), int4_linear(*codes, 64, dense=copy)
    rows = DENSE_ROWS if copy == torch.bfloat16 else FLOAT32_COPY_ROWS
    narrow = torch.randn(1, rows - 1, 128).to(torch.bfloat16)
    assert ops(dense, narrow) >= {"aten::_weight_int4pack_mm_for_cpu"}  # decoding: the int4 kernel
    assert torch.equal(dense(narrow), plain(narrow))
    wide = torch.randn(2, rows, 128)
    ran = ops(dense, wide.to(torch.bfloat16))
    assert "mkldnn::_linear_pointwise" in ran and "aten::_weight_int4pack_mm_for_cpu" not in ran
    got, int4 = dense(wide.to(torch.bfloat16)), plain(wide.to(torch.bfloat16))
    assert got.dtype == torch.bfloat16  # a float32 copy gives its result back in bf16
    got, int4 = got.float(), int4.float()
    # The same weights: as close to the float32 product as the int4 kernel is.
    want = F.linear(wide, weight)
    assert (got - want).abs().max() <= 2 * (int4 - want).abs().max() + 1e-3
    assert torch.allclose(got, want, atol=0.05 * want.abs().max().item(), rtol=0.02)


def ops(fn, x: torch.Tensor) -> set[str]:
    """The operators `fn(x)` ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        fn(x)
    return {event.key for event in profile.key_averages()}


def test_prefill_copies_stop_at_their_memory_budget():
    weight, _ = q4_1_weight()
    plan = KernelPlan(torch.device("cpu"), torch.bfloat16, int4=True)
    copy = torch.bfloat16 if prepack_supported(torch.bfloat16) else torch.float32
    plan.copy_budget = weight.numel() * copy.itemsize * 3 // 2  # room for one copy, not two
    plan.linear(weight)
    plan.linear(weight)
    name = "bf16 copy" if copy == torch.bfloat16 else "fp32 copy"
    assert plan.counts["int4"] == 2 and plan.copies[name] == 1
    assert plan.description == f"int4 x2 ({name} x1)"
    assert plan.copy_budget == weight.numel() * copy.itemsize // 2


def test_a_fixed_plan_gives_every_weight_the_plain_kernel():
    """--reproducible: no oneDNN pre-packing and no int4 kernel, whose rounding follows the CPU
    kind."""
    weight = torch.randn(64, 64)
    fixed = KernelPlan(torch.device("cpu"), torch.float32, int4=True, fixed=True)
    x = torch.randn(3, 64)
    assert torch.equal(fixed.linear(weight)(x), torch.nn.functional.linear(x, weight))
    assert fixed.counts == {"int4": 0, "prepacked": 0, "dense": 1} and not fixed.int4
