"""Whether decode gains from one compiled step: the demo model's decode step written as one
function over fixed shapes, timed eager and through torch.compile beside the lean runner's own
step, in float32, one row, in one run.

The function: each block's norms, q|k|v, RoPE, the KV written in place at a position given as a
tensor into buffers of fixed capacity, attention over the whole buffer with a mask, the MLP, and the
head; no hooks, no Python bookkeeping. `--kernels plain` uses F.linear; `--kernels served` the
runner's own oneDNN pre-packed linears; `--kernels opaque` the same wrapped as a custom op
(torch.library), attention too, which torch.compile keeps as calls and fuses the small ops around.
Its logits are checked against the served step's at every position (the largest difference is
printed) and its greedy tokens followed.

    .venv/bin/python bench/static_step.py [--kernels plain|served] [--compile none|default|freeze]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_speed import PROMPT  # noqa: E402

from millm.engine.attention import rotate  # noqa: E402
from millm.engine.kernels import prepacked_linear  # noqa: E402
from millm.engine.loader import load_model  # noqa: E402
from millm.engine.sources import demo_source  # noqa: E402

CAPACITY = 256


@torch.library.custom_op("millm_bench::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """oneDNN's linear over a pre-reordered weight, opaque to the compiler."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0])


@torch.library.custom_op("millm_bench::attention", mutates_args=())
def opaque_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor, scale: float
) -> torch.Tensor:
    """SDPA (the flash kernel eager picks), opaque to the compiler."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale, enable_gqa=True)


@opaque_attention.register_fake
def _(q, k, v, seen, scale):
    return torch.empty_like(q)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def static_step(lm, kernels: str):
    """step(x [1, 1, d], pos [1], keys, values) -> logits [1, V] over the demo's layout (Llama)."""
    layout = lm.runner.layout
    spec = layout.blocks[0].attention
    heads, kv_heads, head_dim = spec.heads, spec.kv_heads, spec.head_dim
    table = lm.runner.ropes["default"]
    cos_table, sin_table = table.cos[:CAPACITY].clone(), table.sin[:CAPACITY].clone()

    def linear(weight: torch.Tensor):
        weight = weight.detach().float().clone()
        if kernels == "opaque":
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
            return lambda x: packed_linear(x, packed)
        return prepacked_linear(weight) if kernels == "served" else (lambda x: F.linear(x, weight))

    blocks = [
        {
            "n1": (b.attn_norm.weight.detach().clone(), b.attn_norm.variance_epsilon),
            "n2": (b.mlp_norm.weight.detach().clone(), b.mlp_norm.variance_epsilon),
            "qkv": linear(b.attention.qkv[0]),
            "out": linear(b.attention.out[0]),
            "up": linear(b.mlp_in[0]),
            "down": linear(b.mlp_out[0]),
            "inner": b.mlp_out[0].shape[1],
        }
        for b in layout.blocks
    ]
    final = (layout.final_norm.weight.detach().clone(), layout.final_norm.variance_epsilon)
    head_weight = layout.head.weight
    if head_weight.numel() == 0:  # the runner routed the head through its kernel: tied embeddings
        head_weight = lm.model.get_input_embeddings().weight
    head = linear(head_weight)
    split = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]

    def step(x, pos, keys, values):
        cos, sin = cos_table[pos][:, None, None, :], sin_table[pos][:, None, None, :]
        seen = (torch.arange(CAPACITY) <= pos)[None, None, None, :]
        for i, p in enumerate(blocks):
            q, k, v = p["qkv"](rms(x, *p["n1"])).split(split, dim=-1)
            q = rotate(q.view(1, 1, heads, head_dim).transpose(1, 2), cos, sin)
            k = rotate(k.view(1, 1, kv_heads, head_dim).transpose(1, 2), cos, sin)
            keys[i].index_copy_(2, pos, k)
            values[i].index_copy_(2, pos, v.view(1, 1, kv_heads, head_dim).transpose(1, 2))
            if kernels == "opaque":
                o = opaque_attention(q, keys[i], values[i], seen, spec.scaling)
            else:
                o = F.scaled_dot_product_attention(
                    q, keys[i], values[i], attn_mask=seen, scale=spec.scaling, enable_gqa=True
                )
            x = x + p["out"](o.transpose(1, 2).reshape(1, 1, heads * head_dim))
            gate, up = p["up"](rms(x, *p["n2"])).split([p["inner"], p["inner"]], dim=-1)
            x = x + p["down"](F.silu(gate) * up)
        return head(rms(x[:, -1], *final))

    return step, len(blocks), kv_heads, head_dim


def served_step_ms(lm, prompt: list[int], steps: int) -> float:
    """Median ms of the lean runner's own decode step."""
    runner = lm.runner
    with torch.inference_mode():
        batch, logits = runner.prefill([prompt], capacity=len(prompt) + steps + 8)
        token, times = int(logits[0].argmax()), []
        for _ in range(steps):
            start = time.perf_counter()
            logits = runner.step(batch, torch.tensor([token]))
            times.append(time.perf_counter() - start)
            token = int(logits[0].argmax())
    return statistics.median(times) * 1e3


def static_step_ms(lm, prompt, step, shape, steps: int) -> tuple[float, float]:
    """Median ms of `step` and its largest logit difference from the served step, same tokens
    fed."""
    runner, (layers, kv_heads, head_dim) = lm.runner, shape
    with torch.inference_mode():
        batch, logits = runner.prefill([prompt], capacity=len(prompt) + steps + 8)
        n = len(prompt)
        keys = torch.zeros(layers, 1, kv_heads, CAPACITY, head_dim)
        values = torch.zeros_like(keys)
        held = batch.kv.groups[0]
        keys[..., :n, :], values[..., :n, :] = held.keys[..., :n, :], held.values[..., :n, :]
        token, times, difference = int(logits[0].argmax()), [], 0.0
        for s in range(steps):
            pos = torch.tensor([n + s])
            x = runner.layout.embed(torch.tensor([[token]]), pos[None])
            start = time.perf_counter()
            mine = step(x, pos, keys, values)
            times.append(time.perf_counter() - start)
            served = runner.step(batch, torch.tensor([token]))
            difference = max(difference, float((mine - served).abs().max()))
            token = int(served[0].argmax())
    return statistics.median(times) * 1e3, difference


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernels", default="plain", choices=["plain", "served", "opaque"])
    parser.add_argument("--compile", default="none", choices=["none", "default", "freeze"])
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    lm = load_model(demo_source(), dtype="float32", device="cpu", cache_root=home / "cache")
    prompt = lm.tokenizer(PROMPT)["input_ids"]
    step, *shape = static_step(lm, args.kernels)
    print(
        f"\nSmolLM2-135M-Instruct, float32 ({lm.runner.kernels}), one row, "
        f"{torch.get_num_threads()} threads"
    )
    print("| step | ms (median) | largest logit difference from the served step |")
    print("|---|---|---|")
    print(f"| the lean runner's own | {served_step_ms(lm, prompt, args.steps):.2f} | |")
    mine, difference = static_step_ms(lm, prompt, step, shape, args.steps)
    print(f"| one function, {args.kernels} linears, eager | {mine:.2f} | {difference:.1e} |")
    if args.compile != "none":
        import torch._inductor.config as inductor

        inductor.freezing = args.compile == "freeze"
        inductor.cpp_wrapper = args.compile == "freeze"
        compiled = torch.compile(step, fullgraph=True, dynamic=False)
        start = time.perf_counter()
        static_step_ms(lm, prompt, compiled, shape, 2)
        took = time.perf_counter() - start
        mine, difference = static_step_ms(lm, prompt, compiled, shape, args.steps)
        print(
            f"| the same through torch.compile ({args.compile}; {took:.0f} s to compile) | "
            f"{mine:.2f} | {difference:.1e} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
