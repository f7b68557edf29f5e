"""What the lean runner needs to know of a model family, read off a loaded transformers model.

Every family the lean runner serves is a stack of pre-norm blocks with the same two halves,
attention and MLP; they differ in a handful of places, each a field here: norm kind and where
norms sit (Gemma's extra norms after each half), a parallel residual (GPT-NeoX), q/k/v biases
(Qwen 2, GPT-2, GPT-NeoX), QK-norm (Qwen 3, Gemma 3), partial RoPE (GPT-NeoX), learned
positions instead of RoPE (GPT-2), per-layer RoPE tables (Gemma 3's local and global layers),
attention soft-capping and a final logit soft-cap (Gemma 2), sliding-window layers (Gemma 2/3,
Mistral, Qwen with `use_sliding_window`), a gated or a plain MLP and its activation. The norms,
activations, embeddings and rotary modules are the model's own (so their numbers are the
model's); only the weights of the linear layers are taken out, fused where one GEMM can serve.

`layout(model)` returns None for anything else (another family, tensor-parallel Llama, a
bidirectional Gemma 3 embedding model, a multimodal wrapper), which runs on transformers' own
forward instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# (weight [out, in], bias [out] or None), as nn.Linear keeps them.
Weights = tuple[torch.Tensor, torch.Tensor | None]
Rotary = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

SLIDING = "sliding_attention"


def final_softcap(config) -> float | None:
    """The soft-cap on the final logits (Gemma 2), or None."""
    value = getattr(config, "final_logit_softcapping", None)
    return float(value) if value else None


def soft_capped(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Logits through the family's final soft-cap (`cap * tanh(logits / cap)`), as its forward
    does."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


@dataclass
class AttentionLayout:
    """One block's attention: fused q|k|v weights, shapes, and the family's extras."""

    qkv: Weights  # rows: q (heads × head_dim), then k, then v (kv_heads × head_dim each)
    out: Weights
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    rope: str | None  # which RoPE table (None: no rotary embedding, e.g. GPT-2)
    q_norm: torch.nn.Module | None = None
    k_norm: torch.nn.Module | None = None
    softcap: float | None = None
    window: int | None = None  # a key is seen while query - key < window


@dataclass
class BlockLayout:
    """One decoder block: its module (where hooks live), attention, MLP and norms."""

    module: torch.nn.Module
    index: int
    attention: AttentionLayout
    attn_norm: torch.nn.Module
    mlp_norm: torch.nn.Module
    act: Callable[[torch.Tensor], torch.Tensor]
    mlp_in: Weights  # gated: gate rows then up rows; plain: the first projection
    mlp_out: Weights
    gated: bool
    attn_out_norm: torch.nn.Module | None = None  # Gemma 2/3: normalise each half's output
    mlp_out_norm: torch.nn.Module | None = None
    parallel: bool = False  # GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
    # modules whose weights the fused kernels replace
    spent: list[torch.nn.Module] = field(default_factory=list)


@dataclass
class ModelLayout:
    """The whole stack: embeddings, blocks, final norm, head and the RoPE tables by name."""

    family: str
    blocks: list[BlockLayout]
    embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, positions) -> residual
    final_norm: torch.nn.Module
    head: torch.nn.Linear
    rotary: dict[str, Rotary]
    final_softcap: float | None = None


def _linear(module) -> Weights:
    return module.weight, module.bias


def _conv1d(module) -> Weights:
    """GPT-2's Conv1D keeps its weight as [in, out]."""
    return module.weight.t(), module.bias


def _cat(*parts: Weights) -> Weights:
    weight = torch.cat([w for w, _ in parts])
    biases = [b for _, b in parts]
    if all(b is None for b in biases):
        return weight, None
    filled = [
        b if b is not None else w.new_zeros(w.shape[0])
        for (w, _), b in zip(parts, biases, strict=True)
    ]
    return weight, torch.cat(filled)


def _rotary_of_kind(rotary_emb, kind: str) -> Rotary:
    """Gemma 3's rotary module, answering for one kind of layer."""

    def rotary(x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_emb(x, pos, kind)

    return rotary


def _window(config, index: int) -> int | None:
    types = getattr(config, "layer_types", None)
    if types is not None:
        return config.sliding_window if types[index] == SLIDING else None
    return getattr(config, "sliding_window", None)  # Mistral: one window for every layer, when set


def _llama_like(model, family: str) -> ModelLayout:
    """Llama, Mistral, Qwen 2/3, Gemma 2/3 (text): `model.model.layers` of q/k/v/o and
    gate/up/down."""
    config, inner = model.config, model.model
    blocks = []
    for index, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        # Gemma 2/3 normalise each half's output too
        sandwich = hasattr(layer, "pre_feedforward_layernorm")
        layer_type = (
            getattr(config, "layer_types", None) or ["full_attention"] * len(inner.layers)
        )[index]
        attention = AttentionLayout(
            qkv=_cat(_linear(attn.q_proj), _linear(attn.k_proj), _linear(attn.v_proj)),
            out=_linear(attn.o_proj),
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=attn.head_dim,
            scaling=attn.scaling,
            rope=layer_type if family == "gemma3_text" else "default",
            q_norm=getattr(attn, "q_norm", None),
            k_norm=getattr(attn, "k_norm", None),
            softcap=getattr(config, "attn_logit_softcapping", None),
            window=_window(config, index),
        )
        blocks.append(
            BlockLayout(
                module=layer,
                index=index,
                attention=attention,
                attn_norm=layer.input_layernorm,
                mlp_norm=layer.pre_feedforward_layernorm
                if sandwich
                else layer.post_attention_layernorm,
                attn_out_norm=layer.post_attention_layernorm if sandwich else None,
                mlp_out_norm=layer.post_feedforward_layernorm if sandwich else None,
                act=mlp.act_fn,
                mlp_in=_cat(_linear(mlp.gate_proj), _linear(mlp.up_proj)),
                mlp_out=_linear(mlp.down_proj),
                gated=True,
                spent=[
                    attn.q_proj,
                    attn.k_proj,
                    attn.v_proj,
                    attn.o_proj,
                    mlp.gate_proj,
                    mlp.up_proj,
                    mlp.down_proj,
                ],
            )
        )
    if family == "gemma3_text":  # local and global layers rotate by different bases
        rotary = {kind: _rotary_of_kind(inner.rotary_emb, kind) for kind in set(config.layer_types)}
    else:
        rotary = {"default": inner.rotary_emb}
    return ModelLayout(
        family=family,
        blocks=blocks,
        embed=lambda ids, pos: inner.embed_tokens(ids),
        final_norm=inner.norm,
        head=model.get_output_embeddings(),
        rotary=rotary,
        final_softcap=final_softcap(config),
    )


def _gpt2(model) -> ModelLayout:
    """GPT-2: learned positions, LayerNorm, Conv1D weights, a fused q|k|v with biases, GELU MLP."""
    config, inner = model.config, model.transformer
    heads = config.num_attention_heads
    blocks = []
    for index, layer in enumerate(inner.h):
        attn, mlp = layer.attn, layer.mlp
        attention = AttentionLayout(
            qkv=_conv1d(attn.c_attn),
            out=_conv1d(attn.c_proj),
            heads=heads,
            kv_heads=heads,
            head_dim=attn.head_dim,
            scaling=attn.scaling,
            rope=None,
        )
        blocks.append(
            BlockLayout(
                module=layer,
                index=index,
                attention=attention,
                attn_norm=layer.ln_1,
                mlp_norm=layer.ln_2,
                act=mlp.act,
                mlp_in=_conv1d(mlp.c_fc),
                mlp_out=_conv1d(mlp.c_proj),
                gated=False,
                spent=[attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj],
            )
        )
    return ModelLayout(
        family="gpt2",
        blocks=blocks,
        embed=lambda ids, pos: inner.wte(ids) + inner.wpe(pos),
        final_norm=inner.ln_f,
        head=model.get_output_embeddings(),
        rotary={},
    )


def _neox_qkv(module, heads: int, head_dim: int) -> Weights:
    """GPT-NeoX interleaves q, k and v per head; regroup its rows as q|k|v."""
    weight = (
        module.weight.view(heads, 3, head_dim, -1).transpose(0, 1).reshape(3 * heads * head_dim, -1)
    )
    bias = (
        None
        if module.bias is None
        else module.bias.view(heads, 3, head_dim).transpose(0, 1).reshape(-1)
    )
    return weight, bias


def _gpt_neox(model) -> ModelLayout:
    """GPT-NeoX / Pythia: LayerNorm, per-head interleaved q|k|v, partial RoPE, parallel residual."""
    config, inner = model.config, model.gpt_neox
    heads = config.num_attention_heads
    blocks = []
    for index, layer in enumerate(inner.layers):
        attn, mlp = layer.attention, layer.mlp
        attention = AttentionLayout(
            qkv=_neox_qkv(attn.query_key_value, heads, attn.head_size),
            out=_linear(attn.dense),
            heads=heads,
            kv_heads=heads,
            head_dim=attn.head_size,
            scaling=attn.scaling,
            rope="default",
        )
        blocks.append(
            BlockLayout(
                module=layer,
                index=index,
                attention=attention,
                attn_norm=layer.input_layernorm,
                mlp_norm=layer.post_attention_layernorm,
                act=mlp.act,
                mlp_in=_linear(mlp.dense_h_to_4h),
                mlp_out=_linear(mlp.dense_4h_to_h),
                gated=False,
                parallel=layer.use_parallel_residual,
                spent=[attn.query_key_value, attn.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h],
            )
        )
    return ModelLayout(
        family="gpt_neox",
        blocks=blocks,
        embed=lambda ids, pos: inner.embed_in(ids),
        final_norm=inner.final_layer_norm,
        head=model.get_output_embeddings(),
        rotary={"default": inner.rotary_emb},
    )


LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")


def supported(config) -> bool:
    """Whether the lean runner serves this configuration exactly (else transformers' forward runs
    it)."""
    family = getattr(config, "model_type", None)
    if family in LLAMA_LIKE:
        return (
            not getattr(config, "mlp_bias", False)
            and getattr(config, "pretraining_tp", 1) == 1
            and not getattr(config, "use_bidirectional_attention", False)
            # Llama/Mistral biases would be taken, but only Qwen 2 is known to carry them.
            and (family == "qwen2" or not getattr(config, "attention_bias", False))
        )
    if family == "gpt2":
        return not config.add_cross_attention and not config.reorder_and_upcast_attn
    return family == "gpt_neox"


def layout(model) -> ModelLayout | None:
    """The lean layout of a transformers causal LM, or None when the lean runner does not serve
    it."""
    config = model.config
    if not supported(config):
        return None
    family = config.model_type
    if family == "gpt2":
        return _gpt2(model)
    if family == "gpt_neox":
        return _gpt_neox(model)
    return _llama_like(model, family)
