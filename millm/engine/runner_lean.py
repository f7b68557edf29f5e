"""The lean runner: own KV buffer, RoPE tables, fused projections, for every family in families.py.

Decoding one token is ~60 small ops per layer; transformers' generic forward adds its own
bookkeeping (mask building, a KV cache that grows by concatenation, output wrappers). This
runner keeps the decoder-layer *modules* (so forward hooks on a family's decoder blocks still
see and may replace each block's output, which steering relies on) but gives each block a
forward with one GEMM for q|k|v and one for gate|up (or the plain MLP's first projection),
writes keys and values into a preallocated buffer, reads RoPE from tables computed once by the
model's own rotary embedding, and applies the output layer to the last position only. What
differs between families (norm placement, soft-capping, QK-norm, sliding windows, partial or
no RoPE, parallel residual) is read from the model once (`families.layout`). Greedy tokens and
logits equal transformers' in float32 for every family (tested).

Sliding-window layers keep their own buffer, cut back to the window as rows run (kv_cache.py),
and attend over the last `window` positions only: a band mask in a prefill, the buffer's last
`window` columns in a decode step. Rows are left-padded and their real tokens contiguous, so a
column distance is a position distance in every row. A prefill may run a chunk of columns at a
time, after columns restored from a prefix cache (`begin` / `advance`), and a pass may pause between
two blocks (`prefill_layers`: a batch's line yields to a chat there).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch

from millm.engine.attention import Masks, RopeTable, attend, decode_masks, prefill_masks, rotate
from millm.engine.batch import (
    PrefillColumns,
    common_skip,
    extend_mask,
    leading_padding,
    left_pad,
    left_pad_mask,
    positions,
)
from millm.engine.families import (
    BlockLayout,
    ModelLayout,
    layout,
    soft_capped,
    supported,
)
from millm.engine.kernels import KernelPlan, dense_linear, install_linear
from millm.engine.kv_cache import KVBuffer, LayerCache, RowKV
from millm.engine.paused import drained
from millm.engine.prefix_cache import TensorStorage


def fuse_block(block: BlockLayout, plan: KernelPlan) -> None:
    """Give a decoder block a fused forward; the module (and hooks on it) stays."""
    # PyTorch's CPU attention kernel is several times slower in bf16 than in float32 for a
    # one-token query (docs/batching.md), and upcasting
    # the cached keys/values is cheap next to it: decode steps attend in float32 on the CPU.
    upcast_decode = plan.device.type == "cpu" and plan.dtype != torch.float32
    spec = block.attention
    heads, kv_heads, head_dim = spec.heads, spec.kv_heads, spec.head_dim
    split = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    qkv, out = plan.linear(*spec.qkv), plan.linear(*spec.out)
    mlp_in, mlp_out = plan.linear(*block.mlp_in), plan.linear(*block.mlp_out)
    inner = block.mlp_out[0].shape[1]
    act, gated = block.act, block.gated
    attn_norm, attn_out_norm = block.attn_norm, block.attn_out_norm
    mlp_norm, mlp_out_norm = block.mlp_norm, block.mlp_out_norm
    q_norm, k_norm = spec.q_norm, spec.k_norm
    index, window, rope, parallel = block.index, spec.window, spec.rope, block.parallel

    def attention(x, masks: Masks, ropes, cache):
        rows, width, _ = x.shape
        q, k, v = qkv(x).split(split, dim=-1)
        q = q.view(rows, width, heads, head_dim)
        k = k.view(rows, width, kv_heads, head_dim)
        if q_norm is not None and k_norm is not None:
            q, k = q_norm(q), k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(rows, width, kv_heads, head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = ropes[rope]
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = cache.update(k, v, index)
        if width == 1 and upcast_decode:
            q, k, v = q.float(), k.float(), v.float()
        o = attend(q, k, v, masks.sliding if window is not None else masks.full, spec).to(x.dtype)
        o = out(o.transpose(1, 2).reshape(rows, width, heads * head_dim))
        return o if attn_out_norm is None else attn_out_norm(o)

    def mlp(x):
        h = mlp_in(x)
        if gated:
            g, u = h.split([inner, inner], dim=-1)
            h = act(g) * u
        else:
            h = act(h)
        h = mlp_out(h)
        return h if mlp_out_norm is None else mlp_out_norm(h)

    def forward(hidden_states, attention_mask=None, position_embeddings=None, cache=None, **_):
        x = hidden_states
        a = attention(attn_norm(x), attention_mask, position_embeddings, cache)
        if parallel:
            return mlp(mlp_norm(x)) + a + x
        x = x + a
        return x + mlp(mlp_norm(x))

    block.module.forward = forward
    # The separate projections are no longer read; drop their weights rather than hold them twice.
    for linear in block.spent:
        linear.weight = torch.nn.Parameter(linear.weight.new_empty(0), requires_grad=False)  # type: ignore[operator]  # nn.Module types .weight loosely; these are Linear/Conv1D weights


@dataclass
class LeanBatch:
    """A batch's KV caches and its 2-D mask (0 over left padding)."""

    kv: LayerCache
    mask: torch.Tensor
    padded: bool


@dataclass
class LeanPrefill(PrefillColumns):
    """Joining rows being prefilled, a chunk of columns at a time: their batch and left-padded
    ids."""

    batch: LeanBatch
    ids: torch.Tensor


class LeanRunner:
    """Prefill / step / select / merge for every family `families.layout` knows, through the
    fused blocks."""

    mergeable = True
    chunked = True  # prefills in chunks, from restored KV (begin / advance / row_kv)
    prefix_storage = TensorStorage()  # what a prefix cache keeps: copies of KV tensors

    @staticmethod
    def supports(model) -> bool:
        """Whether the lean runner serves this model."""
        return supported(model.config)

    def __init__(
        self,
        model,
        device: torch.device,
        dtype: torch.dtype,
        body: KernelPlan | None,
        head: KernelPlan | None,
    ):
        self.model, self.device, self.dtype = model, device, dtype
        found = layout(model)
        if found is None:
            raise ValueError(f"the lean runner does not serve {model.config.model_type}")
        self.layout: ModelLayout = found
        self.name = f"lean ({found.family})"
        body = body or KernelPlan(device, dtype, int4=False)
        lm_head = found.head
        head_fn = (
            head.linear(lm_head.weight, lm_head.bias)
            if head is not None
            else dense_linear(lm_head.weight, lm_head.bias)
        )
        for block in found.blocks:
            fuse_block(block, body)
        head_dtype = head.dtype if head is not None else dtype
        install_linear(lm_head, lambda x: head_fn(x.to(head_dtype)))
        model.to(dtype)
        self.kernels = body.description
        self.ropes = {name: RopeTable(fn, dtype, device) for name, fn in found.rotary.items()}
        first = found.blocks[0].attention
        self.kv_heads, self.head_dim = first.kv_heads, first.head_dim
        windows = {b.attention.window for b in found.blocks if b.attention.window is not None}
        if len(windows) > 1:
            raise ValueError(
                f"the lean runner takes one sliding window per model, not {sorted(windows)}"
            )
        self.window = next(iter(windows), None)
        # Layers grouped by window (None: global), each group one buffer; where[i] = (group, index
        # in it).
        by_window: dict[int | None, list[int]] = {}
        for block in found.blocks:
            by_window.setdefault(block.attention.window, []).append(block.index)
        self.groups = sorted(by_window.items(), key=lambda item: item[0] is not None)
        self.where = [(0, 0)] * len(found.blocks)
        for group, (_, layers) in enumerate(self.groups):
            for index, layer in enumerate(layers):
                self.where[layer] = (group, index)

    def rope(self, pos: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Every RoPE table's (cos, sin) for position ids `[B, T]`."""
        return {name: table(pos) for name, table in self.ropes.items()}

    def _hidden(
        self, ids: torch.Tensor, pos: torch.Tensor, masks: Masks, kv: LayerCache
    ) -> torch.Tensor:
        return drained(self._layers(ids, pos, masks, kv))

    def _layers(
        self, ids: torch.Tensor, pos: torch.Tensor, masks: Masks, kv: LayerCache
    ) -> Generator[None, object, torch.Tensor]:
        """`_hidden` a block at a time: yields after each block, returns the last block's
        output."""
        x = self.layout.embed(ids, pos)
        ropes = self.rope(pos)
        for block in self.layout.blocks:
            x = block.module(x, attention_mask=masks, position_embeddings=ropes, cache=kv)
            yield
        return x

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of final-normalised hidden states (the family's final soft-cap
        applied)."""
        logits = self.layout.head(hidden).float()
        return soft_capped(logits, self.layout.final_softcap)

    def _last_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits `[B, V]` of each row's last column of block outputs `[B, T, d]`."""
        return self.head_logits(self.layout.final_norm(x[:, -1:]))[:, -1]

    def _buffer(self, rows: int, capacity: int, width: int) -> LayerCache:
        """Empty caches for `rows` rows; a sliding group holds at most `width` (this prefill) or
        2 × window columns."""
        groups = []
        for keep, layers in self.groups:
            held = capacity if keep is None else min(capacity, max(width, 2 * keep))
            groups.append(
                KVBuffer(
                    len(layers),
                    rows,
                    self.kv_heads,
                    held,
                    self.head_dim,
                    self.dtype,
                    self.device,
                    keep,
                )
            )
        return LayerCache(groups, self.where)

    def hidden_states(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Final normalised hidden states `[B, T, d]` of left-padded prompts, with their mask."""
        return drained(self._hidden_states_layers(prompts))

    def _hidden_states_layers(
        self, prompts: list[list[int]]
    ) -> Generator[None, object, tuple[torch.Tensor, torch.Tensor]]:
        ids, mask = left_pad(prompts, self.device)
        rows, width = ids.shape
        x = yield from self._layers(
            ids, positions(mask), prefill_masks(mask, self.window), self._buffer(rows, width, width)
        )
        return self.layout.final_norm(x), mask

    def prompt_logits(self, sequence: list[int], start: int) -> torch.Tensor:
        """Logits `[len - start, V]` at the positions predicting sequence[start:] (start >= 1);
        only those go through the head."""
        return drained(self.prompt_logits_layers(sequence, start))

    def prompt_logits_layers(
        self, sequence: list[int], start: int
    ) -> Generator[None, object, torch.Tensor]:
        """`prompt_logits`, yielding after each block."""
        hidden, _ = yield from self._hidden_states_layers([sequence])
        return self.head_logits(hidden[0, start - 1 : len(sequence) - 1])

    def prefill(self, prompts: list[list[int]], capacity: int) -> tuple[LeanBatch, torch.Tensor]:
        """Run the prompts into a buffer holding `capacity` positions; returns the batch and
        logits `[B, V]`."""
        return drained(self.prefill_layers(prompts, capacity))

    def prefill_layers(
        self, prompts: list[list[int]], capacity: int
    ) -> Generator[None, object, tuple[LeanBatch, torch.Tensor]]:
        """`prefill`, yielding after each block: the same operations on the same shapes, so the
        logits are a whole pass's whenever it pauses."""
        prefill = self.begin(prompts, capacity)
        logits = yield from self.advance_layers(prefill, None)
        assert logits is not None  # one pass covers every column
        return prefill.batch, logits

    def begin(
        self, prompts: list[list[int]], capacity: int, restored: list[RowKV | None] | None = None
    ) -> LeanPrefill:
        """A prefill of left-padded prompts, nothing computed yet; row i may bring the KV of its
        first positions (`restored[i]`), and keeps as many of them as every row can skip together:
        the columns before the widest remaining part, which all rows then compute as one block."""
        ids, mask = left_pad(prompts, self.device)
        rows, width = ids.shape
        lengths = [len(p) for p in prompts]
        offered = [0 if kv is None else kv[0][0].shape[2] for kv in (restored or [None] * rows)]
        done, reused = common_skip(lengths, offered)
        kv = self._buffer(rows, capacity, width)
        for row, parts in enumerate(restored or []):
            if parts is None or reused[row] == 0:
                continue
            first = width - lengths[row]
            for group, (keys, values) in zip(kv.groups, parts, strict=True):
                group.keys[:, row, :, first:done] = keys[:, :, : reused[row]]
                group.values[:, row, :, first:done] = values[:, :, : reused[row]]
        for group in kv.groups:
            group.length = done
        return LeanPrefill(lengths, done, reused, LeanBatch(kv, mask, not bool(mask.all())), ids)

    def advance(self, prefill: LeanPrefill, tokens: int | None) -> torch.Tensor | None:
        """Compute the next `tokens` columns (None: all that are left); the last chunk returns
        the logits `[B, V]`."""
        return drained(self.advance_layers(prefill, tokens))

    def advance_layers(
        self, prefill: LeanPrefill, tokens: int | None
    ) -> Generator[None, object, torch.Tensor | None]:
        """`advance`, yielding after each block."""
        start, end = prefill.done, prefill.span(tokens)
        mask = prefill.batch.mask[:, :end]
        pos = positions(mask)[:, start:]
        x = yield from self._layers(
            prefill.ids[:, start:end],
            pos,
            prefill_masks(mask, self.window, start),
            prefill.batch.kv,
        )
        prefill.done = end
        return self._last_logits(x) if prefill.finished else None

    def row_kv(self, batch: LeanBatch, row: int, start: int, end: int) -> RowKV | None:
        """Copies of one row's keys and values at its positions start..end, or None where a sliding
        group has already let some of them go."""
        width = batch.kv.length
        first = width - int(batch.mask[row].sum())  # the row's position 0
        parts = []
        for group in batch.kv.groups:
            held = first + start - group.dropped
            if held < 0:
                return None
            columns = slice(held, held + end - start)
            parts.append(
                (group.keys[:, row, :, columns].clone(), group.values[:, row, :, columns].clone())
            )
        return parts

    def step(self, batch: LeanBatch, next_ids: torch.Tensor) -> torch.Tensor:
        """Feed each row its newest token; returns the next-token logits `[B, V]`."""
        batch.mask = extend_mask(batch.mask)
        pos = batch.mask.sum(-1, keepdim=True) - 1
        return self._last_logits(
            self._hidden(
                next_ids.view(-1, 1), pos, decode_masks(batch.mask, batch.padded), batch.kv
            )
        )

    def select_rows(self, batch: LeanBatch, indices: list[int]) -> None:
        """Keep (or repeat) rows by index, in the given order; padding no row needs any more is
        cut."""
        index = torch.tensor(indices, dtype=torch.long, device=batch.mask.device)
        mask = batch.mask[index]
        start = leading_padding(mask)
        batch.kv.select_rows(index, start)
        batch.mask = mask[:, start:]
        batch.padded = not bool(batch.mask.all())

    def merge(self, a: LeanBatch, b: LeanBatch, room: int) -> LeanBatch:
        """One batch of a's rows then b's (left-padded to a common length), with `room` positions
        to grow."""
        kv = LayerCache.merged(a.kv, b.kv, room)
        mask = torch.cat([left_pad_mask(a.mask, kv.length), left_pad_mask(b.mask, kv.length)])
        return LeanBatch(kv, mask, not bool(mask.all()))
