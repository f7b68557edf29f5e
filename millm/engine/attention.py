"""Attention's pieces for the lean runner: rotary position tables, the masks of a prefill chunk
and of a decode step (sliding windows, left padding), and scaled dot-product attention over the
KV cache, upcast to float32 on the CPU where bf16's kernel is slow."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from millm.engine.families import (
    AttentionLayout,
    Rotary,
)


class RopeTable:
    """cos/sin per position, computed by the model's own rotary embedding (so any rope scaling
    holds)."""

    def __init__(self, rotary: Rotary, dtype, device, length: int = 4096):
        self.rotary, self.dtype, self.device = rotary, dtype, device
        self._grow(length)

    def _grow(self, length: int) -> None:
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(probe, torch.arange(length, device=self.device)[None])
        self.cos, self.sin = cos[0], sin[0]

    def __call__(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) `[B, T, rotary_dim]` for position ids `[B, T]`."""
        needed = int(pos.max()) + 1
        if needed > self.cos.shape[0]:
            self._grow(max(needed, 2 * self.cos.shape[0]))
        return self.cos[pos], self.sin[pos]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE (rotate_half convention) to the first cos.shape[-1] dims of x (all of them but
    in GPT-NeoX)."""
    width = cos.shape[-1]
    if width < x.shape[-1]:
        return torch.cat((rotate(x[..., :width], cos, sin), x[..., width:]), dim=-1)
    half = width // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass(frozen=True)
class Masks:
    """Attention masks of one forward pass, `[B, 1, Tq, Tk]` bool (True: seen). None: plain causal
    (every key seen in a decode step). In a decode step the sliding layers cut the keys
    themselves."""

    full: torch.Tensor | None
    sliding: torch.Tensor | None


def prefill_masks(mask: torch.Tensor, window: int | None, start: int = 0) -> Masks:
    """Masks for a prefill of left-padded rows (`mask` [B, T], 0 over padding) whose queries are
    columns `start`..T (a chunk after `start` columns already in the cache; 0: the whole prompt)."""
    padded = not bool(mask.all())
    width = mask.shape[1]
    if start == 0 and not padded and (window is None or width <= window):
        return Masks(None, None)  # plain causal: SDPA's own (top-left aligned, right for a square)
    queries = torch.arange(start, width, device=mask.device)[:, None]
    keys = torch.arange(width, device=mask.device)[None]
    # Causal, padding keys hidden, and each position sees itself: a padding query would otherwise
    # see no key at all and SDPA would return NaN there, which the cache would carry on.
    full = ((keys <= queries)[None] & mask.bool()[:, None, :]) | (keys == queries)[None]
    if window is None:
        return Masks(full[:, None], full[:, None])
    return Masks(full[:, None], (full & ((queries - keys) < window)[None])[:, None])


def decode_masks(mask: torch.Tensor, padded: bool) -> Masks:
    """Masks for one new token per row."""
    full = mask.bool()[:, None, None, :] if padded else None
    return Masks(full, full)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    spec: AttentionLayout,
) -> torch.Tensor:
    """Attention of queries `[B, H, Tq, D]` over keys/values `[B, KV, Tk, D]` as the family
    computes it."""
    width = q.shape[2]
    if spec.window is not None and width == 1 and k.shape[2] > spec.window:
        k, v = k[:, :, -spec.window :], v[:, :, -spec.window :]
        mask = None if mask is None else mask[..., -spec.window :]
    if spec.softcap is None:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and width > 1,
            scale=spec.scaling,
            enable_gqa=True,
        )
    # SDPA has no soft-capping: Gemma 2's eager attention, scores capped by tanh before the mask.
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * spec.scaling
    scores = torch.tanh(scores / spec.softcap) * spec.softcap
    if mask is None and width > 1:
        mask = torch.ones(width, k.shape[2], dtype=torch.bool, device=q.device).tril(
            k.shape[2] - width
        )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
