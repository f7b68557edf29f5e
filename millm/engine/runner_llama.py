"""A lean runner for the Llama family: own KV buffer, RoPE table, fused projections.

Decoding one token is ~60 small ops per layer; transformers' generic forward adds its own
bookkeeping (mask building, a KV cache that grows by concatenation, output wrappers). This
runner keeps the decoder-layer *modules* (so forward hooks on `model.model.layers[L]` still
see and may replace each layer's output, which steering relies on) but gives each layer a
forward with one GEMM for q|k|v and one for gate|up, writes keys and values into a
preallocated buffer, and reads RoPE from a table computed once by the model's own rotary
embedding. Greedy tokens equal transformers' in float32 (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from millm.engine.batch import extend_mask, leading_padding, left_pad, left_pad_mask, padded_prefill_mask, positions
from millm.engine.kernels import KernelPlan, dense_linear, install_linear
from millm.engine.runner_hf import HeadOverHidden


class KVBuffer:
    """Keys and values of every layer, `[layers, B, kv_heads, capacity, head_dim]`, filled left to right."""

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype, device):
        shape = (layers, rows, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self.last_layer = layers - 1

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *args, **kwargs):
        """Write this step's keys/values for `layer`; return views of everything written so far."""
        end = self.length + keys.shape[2]
        if end > self.keys.shape[3]:
            raise RuntimeError(f"KV buffer overflow: {end} positions, capacity {self.keys.shape[3]}")
        layer_keys, layer_values = self.keys[layer, :, :, :end], self.values[layer, :, :, :end]
        layer_keys[:, :, self.length :].copy_(keys)
        layer_values[:, :, self.length :].copy_(values)
        if layer == self.last_layer:
            self.length = end
        return layer_keys, layer_values

    def select_rows(self, index: torch.Tensor, start: int = 0) -> None:
        """Keep (or repeat) rows by index, dropping the first `start` positions of every row."""
        self.keys = self.keys[:, index, :, start:].contiguous()
        self.values = self.values[:, index, :, start:].contiguous()
        self.length -= start

    @classmethod
    def merged(cls, a: KVBuffer, b: KVBuffer, room: int) -> KVBuffer:
        """A buffer holding a's rows then b's, right-aligned at the longer length, with `room` free positions."""
        length = max(a.length, b.length)
        layers, rows_a, kv_heads, _, head_dim = a.keys.shape
        rows = rows_a + b.keys.shape[1]
        merged = cls(layers, rows, kv_heads, length + room, head_dim, a.keys.dtype, a.keys.device)
        for source, rows_slice in ((a, slice(0, rows_a)), (b, slice(rows_a, rows))):
            offset = length - source.length
            merged.keys[:, rows_slice, :, offset:length] = source.keys[:, :, :, : source.length]
            merged.values[:, rows_slice, :, offset:length] = source.values[:, :, :, : source.length]
        merged.length = length
        return merged


class RopeTable:
    """cos/sin per position, computed by the model's own rotary embedding (so any rope scaling holds)."""

    def __init__(self, rotary, dtype, device, length: int = 4096):
        self.rotary, self.dtype, self.device = rotary, dtype, device
        self._grow(length)

    def _grow(self, length: int) -> None:
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(probe, torch.arange(length, device=self.device)[None])
        self.cos, self.sin = cos[0], sin[0]

    def __call__(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) `[B, T, head_dim]` for position ids `[B, T]`."""
        needed = int(pos.max()) + 1
        if needed > self.cos.shape[0]:
            self._grow(max(needed, 2 * self.cos.shape[0]))
        return self.cos[pos], self.sin[pos]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE as Llama does (rotate_half convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def fuse_layer(layer, config, plan: KernelPlan) -> None:
    """Give a LlamaDecoderLayer a fused forward; the module (and hooks on it) stays."""
    # PyTorch's CPU attention kernel is several times slower in bf16 than in float32 for a
    # one-token query (570 vs 130 us at 8 rows x 150 positions, measured), and upcasting
    # the cached keys/values is cheap next to it: decode steps attend in float32 on the CPU.
    upcast_decode = plan.device.type == "cpu" and plan.dtype != torch.float32
    attn, mlp = layer.self_attn, layer.mlp
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = attn.head_dim
    split = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    inner = mlp.gate_proj.out_features
    qkv = plan.linear(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    out = plan.linear(attn.o_proj.weight)
    gate_up = plan.linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    down = plan.linear(mlp.down_proj.weight)
    pre_norm, post_norm = layer.input_layernorm, layer.post_attention_layernorm
    index, scaling = attn.layer_idx, attn.scaling

    def forward(hidden_states, attention_mask=None, position_embeddings=None, cache=None, **_):
        x = hidden_states
        rows, width, _ = x.shape
        q, k, v = qkv(pre_norm(x)).split(split, dim=-1)
        q = q.view(rows, width, heads, head_dim).transpose(1, 2)
        k = k.view(rows, width, kv_heads, head_dim).transpose(1, 2)
        v = v.view(rows, width, kv_heads, head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        k, v = cache.update(rotate(k, cos, sin), v, index)
        q = rotate(q, cos, sin)
        if width == 1 and upcast_decode:
            q, k, v = q.float(), k.float(), v.float()
        o = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attention_mask,
            is_causal=attention_mask is None and width > 1,
            scale=scaling,
            enable_gqa=True,
        ).to(x.dtype)
        x = x + out(o.transpose(1, 2).reshape(rows, width, heads * head_dim))
        g, u = gate_up(post_norm(x)).split([inner, inner], dim=-1)
        return x + down(F.silu(g) * u)

    layer.forward = forward
    # The separate projections are no longer read; drop their weights rather than hold them twice.
    for linear in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        linear.weight = torch.nn.Parameter(linear.weight.new_empty(0), requires_grad=False)


@dataclass
class LlamaBatch:
    """A batch's KV buffer and its 2-D mask (0 over left padding)."""

    kv: KVBuffer
    mask: torch.Tensor
    padded: bool


class LlamaRunner(HeadOverHidden):
    """Prefill / step / select for Llama-architecture models, through the lean forward."""

    name = "llama-lean"

    @staticmethod
    def supports(model) -> bool:
        """Plain Llama blocks only: no projection biases, SiLU MLP, no tensor-parallel split."""
        config = model.config
        return (
            getattr(config, "model_type", None) == "llama"
            and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False)
            and getattr(config, "hidden_act", "silu") == "silu"
            and getattr(config, "pretraining_tp", 1) == 1
        )

    def __init__(self, model, device: torch.device, dtype: torch.dtype, body: KernelPlan | None, head: KernelPlan | None):
        self.model, self.device, self.dtype = model, device, dtype
        config = model.config
        body = body or KernelPlan(device, dtype, int4=False)
        for layer in model.model.layers:
            fuse_layer(layer, config, body)
        lm_head = model.lm_head
        head_fn = head.linear(lm_head.weight, lm_head.bias) if head is not None else dense_linear(lm_head.weight, lm_head.bias)
        head_dtype = head.dtype if head is not None else dtype
        install_linear(lm_head, lambda x: head_fn(x.to(head_dtype)))
        model.to(dtype)
        self.kernels = body.description
        self.rope = RopeTable(model.model.rotary_emb, dtype, device)
        self.kv_heads = config.num_key_value_heads
        self.head_dim = model.model.layers[0].self_attn.head_dim

    def _hidden(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, kv: KVBuffer) -> torch.Tensor:
        inner = self.model.model
        x = inner.embed_tokens(ids)
        rope = self.rope(pos)
        for layer in inner.layers:
            x = layer(x, attention_mask=mask, position_embeddings=rope, cache=kv)
        return x

    def _logits(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, kv: KVBuffer) -> torch.Tensor:
        x = self._hidden(ids, pos, mask, kv)
        return self.model.lm_head(self.model.model.norm(x[:, -1:]))[:, -1].float()

    def _buffer(self, rows: int, capacity: int) -> KVBuffer:
        layers = len(self.model.model.layers)
        return KVBuffer(layers, rows, self.kv_heads, capacity, self.head_dim, self.dtype, self.device)

    def hidden_states(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Final normalised hidden states `[B, T, d]` of left-padded prompts, with their mask."""
        ids, mask = left_pad(prompts, self.device)
        padded = not bool(mask.all())
        x = self._hidden(ids, positions(mask), padded_prefill_mask(mask) if padded else None, self._buffer(*ids.shape))
        return self.model.model.norm(x), mask

    def prefill(self, prompts: list[list[int]], capacity: int) -> tuple[LlamaBatch, torch.Tensor]:
        """Run the prompts into a buffer holding `capacity` positions; returns the batch and logits `[B, V]`."""
        ids, mask = left_pad(prompts, self.device)
        kv = self._buffer(ids.shape[0], capacity)
        padded = not bool(mask.all())
        logits = self._logits(ids, positions(mask), padded_prefill_mask(mask) if padded else None, kv)
        return LlamaBatch(kv, mask, padded), logits

    def step(self, batch: LlamaBatch, next_ids: torch.Tensor) -> torch.Tensor:
        """Feed each row its newest token; returns the next-token logits `[B, V]`."""
        batch.mask = extend_mask(batch.mask)
        pos = batch.mask.sum(-1, keepdim=True) - 1
        attention = batch.mask.bool()[:, None, None, :] if batch.padded else None
        return self._logits(next_ids.view(-1, 1), pos, attention, batch.kv)

    def select_rows(self, batch: LlamaBatch, indices: list[int]) -> None:
        """Keep (or repeat) rows by index, in the given order; padding no row needs any more is cut."""
        index = torch.tensor(indices, dtype=torch.long, device=batch.mask.device)
        mask = batch.mask[index]
        start = leading_padding(mask)
        batch.kv.select_rows(index, start)
        batch.mask = mask[:, start:]
        batch.padded = not bool(batch.mask.all())

    mergeable = True

    def merge(self, a: LlamaBatch, b: LlamaBatch, room: int) -> LlamaBatch:
        """One batch of a's rows then b's (left-padded to a common length), with `room` positions to grow."""
        kv = KVBuffer.merged(a.kv, b.kv, room)
        mask = torch.cat([left_pad_mask(a.mask, kv.length), left_pad_mask(b.mask, kv.length)])
        return LlamaBatch(kv, mask, not bool(mask.all()))
