"""Where a training's activations wait: in memory, a bounded shuffling buffer (SAELens's
mixing-buffer scheme: once full, it is shuffled and its first half given out as batches, the other
half kept to mix with what comes next); on disk, the first epoch's rows for the later epochs to
replay."""

from __future__ import annotations

from pathlib import Path

import torch

CACHE_FILE = "activations.f32"  # the first epoch's activations, when there are more epochs


class ShuffleBuffer:
    """A bounded store of activation rows, given out in shuffled batches (see the module's
    docstring); it never holds more than `capacity` rows."""

    def __init__(self, capacity: int, d_in: int, batch: int, generator: torch.Generator):
        if capacity < 2 * batch:
            raise ValueError(f"a buffer of {capacity} rows cannot mix batches of {batch}")
        self.rows = torch.empty(capacity, d_in)
        self.filled, self.batch, self.generator = 0, batch, generator

    def put(self, activations: torch.Tensor) -> list[torch.Tensor]:
        """Add rows; the batches ready to train on (each time the buffer fills)."""
        out: list[torch.Tensor] = []
        start = 0
        while start < len(activations):
            room = len(self.rows) - self.filled
            piece = activations[start : start + room]
            self.rows[self.filled : self.filled + len(piece)] = piece
            self.filled += len(piece)
            start += len(piece)
            if self.filled == len(self.rows):
                out += self._give(len(self.rows) // 2 // self.batch * self.batch)
        return out

    def drain(self) -> list[torch.Tensor]:
        """The whole batches left, shuffled (the end of the corpus); the rest is dropped."""
        return self._give(self.filled // self.batch * self.batch)

    def _give(self, count: int) -> list[torch.Tensor]:
        if count == 0:
            return []
        order = torch.randperm(self.filled, generator=self.generator)
        self.rows[: self.filled] = self.rows[order]
        given = self.rows[:count].clone()
        kept = self.filled - count
        self.rows[:kept] = self.rows[count : self.filled].clone()
        self.filled = kept
        return list(given.split(self.batch))


class ActivationCache:
    """The activations of a training's first epoch on disk (float32 rows, appended), replayed by
    the later epochs a chunk at a time: the disk holds the corpus's activations, memory only the
    chunk read back. numpy: it is read on the job's thread."""

    def __init__(self, path: Path, d_in: int):
        self.path, self.d_in = path, d_in
        self.row_bytes = d_in * 4

    def truncate(self, rows: int) -> None:
        """Keep the first `rows` (a resumed training drops what came after its checkpoint)."""
        with self.path.open("ab") as handle:
            handle.truncate(rows * self.row_bytes)

    def append(self, activations: torch.Tensor) -> None:
        """Rows read from the model, at the end."""
        with self.path.open("ab") as handle:
            handle.write(activations.float().contiguous().numpy().tobytes())

    def chunks(self, start: int, rows: int):
        """The rows from `start` on, `rows` at a time, as tensors."""
        total = self.path.stat().st_size // self.row_bytes
        with self.path.open("rb") as handle:
            handle.seek(start * self.row_bytes)
            for first in range(start, total, rows):
                count = min(rows, total - first)
                data = handle.read(count * self.row_bytes)
                yield torch.frombuffer(bytearray(data), dtype=torch.float32).view(count, self.d_in)
