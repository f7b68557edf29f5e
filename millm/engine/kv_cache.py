"""The lean runner's keys and values: one preallocated buffer per group of layers (global, or one
sliding window), rows left-padded and right-aligned, so rows can join, leave and be cut."""

from __future__ import annotations

import torch

# Per row, per KV group (LeanRunner.groups): keys and values `[layers, kv_heads, T, head_dim]`
# of the row's first T positions, as a prefix cache hands them back.
RowKV = list[tuple[torch.Tensor, torch.Tensor]]


class KVBuffer:
    """Keys and values of a group of layers, `[layers, B, kv_heads, capacity, head_dim]`, filled
    left to right.

    With `keep` (sliding-window layers), only the newest columns are held: when a write would
    overflow, the last `keep` columns move to the front of a buffer of 2 × keep, so a row's
    memory stays bounded by its window however long it runs. `dropped` counts the columns let go;
    `dropped + length` is the batch's width, as on a full buffer.
    """

    def __init__(
        self,
        layers: int,
        rows: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype,
        device,
        keep: int | None = None,
    ):
        shape = (layers, rows, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self.dropped = 0
        self.keep = keep

    @property
    def width(self) -> int:
        """Columns of the batch this buffer stands for (held or let go)."""
        return self.dropped + self.length

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *args, **kwargs):
        """Write this step's keys/values for `layer` (an index in this group); return views of
        every held column."""
        end = self.length + keys.shape[2]
        if (
            end > self.keys.shape[3]
            and layer == 0
            and self.keep is not None
            and self.length > self.keep
        ):
            self._compact()
            end = self.length + keys.shape[2]
        if end > self.keys.shape[3]:
            raise RuntimeError(
                f"KV buffer overflow: {end} positions, capacity {self.keys.shape[3]}"
            )
        layer_keys, layer_values = self.keys[layer, :, :, :end], self.values[layer, :, :, :end]
        layer_keys[:, :, self.length :].copy_(keys)
        layer_values[:, :, self.length :].copy_(values)
        if layer == self.keys.shape[0] - 1:
            self.length = end
        return layer_keys, layer_values

    def _compact(self) -> None:
        """Hold only the last `keep` columns, at the front of a buffer with room for `keep` more."""
        assert self.keep is not None
        layers, rows, kv_heads, _, head_dim = self.keys.shape
        kept = slice(self.length - self.keep, self.length)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((layers, rows, kv_heads, 2 * self.keep, head_dim))
            new[:, :, :, : self.keep] = old[:, :, :, kept]
            setattr(self, name, new)
        self.dropped += self.length - self.keep
        self.length = self.keep

    def select_rows(self, index: torch.Tensor, start: int = 0) -> None:
        """Keep (or repeat) rows by index, dropping the first `start` columns of the batch."""
        cut = max(0, start - self.dropped)  # only columns this buffer still holds
        self.keys = self.keys[:, index, :, cut:].contiguous()
        self.values = self.values[:, index, :, cut:].contiguous()
        self.dropped = max(0, self.dropped - start)
        self.length -= cut

    @classmethod
    def merged(cls, a: KVBuffer, b: KVBuffer, room: int) -> KVBuffer:
        """A buffer holding a's rows then b's, right-aligned at the wider batch, with `room` free
        positions.

        A windowed buffer holds the more columns of the two; a row whose own buffer let some of
        them go gets zeros there, which lie outside its window and are never attended."""
        width = max(a.width, b.width)
        length = max(a.length, b.length)
        layers, rows_a, kv_heads, _, head_dim = a.keys.shape
        rows = rows_a + b.keys.shape[1]
        capacity = length + (room if a.keep is None else min(room, a.keep))
        merged = cls(
            layers, rows, kv_heads, capacity, head_dim, a.keys.dtype, a.keys.device, a.keep
        )
        for source, rows_slice in ((a, slice(0, rows_a)), (b, slice(rows_a, rows))):
            # a source's held columns are the batch's last ones, right-aligned
            offset = length - source.length
            merged.keys[:, rows_slice, :, offset:length] = source.keys[:, :, :, : source.length]
            merged.values[:, rows_slice, :, offset:length] = source.values[:, :, :, : source.length]
        merged.length, merged.dropped = length, width - length
        return merged


class LayerCache:
    """Every layer's keys and values: one buffer for the global layers, one per sliding window
    (layer `i` lives in group `where[i][0]` at index `where[i][1]`)."""

    def __init__(self, groups: list[KVBuffer], where: list[tuple[int, int]]):
        self.groups, self.where = groups, where

    @property
    def length(self) -> int:
        """Columns of the batch (every group stands for the same ones)."""
        return self.groups[0].width

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *args, **kwargs):
        """Write `layer`'s keys/values for this step; return every column its group holds."""
        group, index = self.where[layer]
        return self.groups[group].update(keys, values, index)

    def select_rows(self, index: torch.Tensor, start: int = 0) -> None:
        """Keep (or repeat) rows by index, dropping the batch's first `start` columns."""
        for group in self.groups:
            group.select_rows(index, start)

    @classmethod
    def merged(cls, a: LayerCache, b: LayerCache, room: int) -> LayerCache:
        """a's rows then b's, right-aligned, with `room` positions to grow."""
        return cls(
            [KVBuffer.merged(x, y, room) for x, y in zip(a.groups, b.groups, strict=True)], a.where
        )
