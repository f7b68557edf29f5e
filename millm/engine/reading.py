"""Capturing residual vectors for a row while it runs: the engine's half of SAE reads.

A row's `ResidualRead`s name a point, a side of the point's edits and the positions wanted. A
`Capture` keeps the vectors of the wanted positions (float32 copies, on the model's device: a step
never waits for a copy to the host) as the row's forward passes go by, and gathers them on the CPU
once, when the row reports; `taps` turns the rows of one forward pass into the residual editor's
readers. Any `Reader` rides the same taps (a watch's scorer does). Encoding the vectors with an SAE
happens outside the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from millm.engine.jobs import ResidualRead, ResidualsRead
from millm.engine.residual import Tap


class Reader(Protocol):
    """Something that sees one row's residual at a point, before or after the point's edits."""

    point: int
    after_edit: bool

    def take(self, first: int, hidden: torch.Tensor) -> None:
        """See the row's real columns `[T, d]`, whose first is at absolute position `first`."""


class Capture:
    """The positions one read wants of one row, and the vectors kept so far."""

    def __init__(self, read: ResidualRead, prompt_length: int):
        self.read, self.prompt_length = read, prompt_length
        self.point, self.after_edit = read.point, read.after_edit
        self.positions: list[int] = []
        self.vectors: list[torch.Tensor] = []

    def wants(self, position: int) -> bool:
        """Whether this read keeps `position` (absolute over prompt then generated tokens)."""
        spec = self.read.positions
        if spec == "all" or spec == "last":  # == narrows the type for mypy (`in` a tuple does not)
            return True
        if spec == "prompt":
            return position < self.prompt_length
        if spec == "completion":
            return position >= self.prompt_length
        start, end = spec
        return start <= position < end

    def take(self, first: int, hidden: torch.Tensor) -> None:
        """Keep the wanted rows of `hidden` `[T, d]`, whose first row is at position `first`."""
        wanted = [i for i in range(hidden.shape[0]) if self.wants(first + i)]
        if not wanted:
            return
        if self.read.positions == "last":  # only the newest position read counts
            wanted = wanted[-1:]
            self.positions, self.vectors = [], []
        rows = (
            hidden[wanted[0] : wanted[-1] + 1]
            if len(wanted) == wanted[-1] - wanted[0] + 1
            else hidden[wanted]
        )
        self.positions.extend(first + i for i in wanted)
        self.vectors.append(rows.detach().to(torch.float32, copy=True))

    def result(self, row: int, tokens: list[int]) -> ResidualsRead:
        """The event that reports this capture (tokens: the row's prompt then generated ids)."""
        width = self.vectors[0].shape[-1] if self.vectors else 0
        residuals = torch.cat(self.vectors).cpu() if self.vectors else torch.zeros(0, width)
        encoded = self.read.encode(residuals) if self.read.encode is not None else None
        return ResidualsRead(
            row,
            self.read.tag,
            tuple(self.positions),
            tuple(tokens[p] for p in self.positions),
            residuals,
            encoded,
        )


def taps(columns: list[tuple[Sequence[Reader], int, int]]) -> dict[int, Tap]:
    """Taps for one forward pass. `columns[i]` is batch row i's readers (Captures, or any
    Reader), the position of its first real column and how many real columns it has (they are
    the row's last columns)."""
    points = {reader.point for readers, _, _ in columns for reader in readers}

    def reader(point: int) -> Tap:
        def tap(before: torch.Tensor, after: torch.Tensor) -> None:
            for i, (readers, first, count) in enumerate(columns):
                for one in readers:
                    if one.point == point:
                        hidden = after if one.after_edit else before
                        one.take(first, hidden[i, hidden.shape[1] - count :])

        return tap

    return {point: reader(point) for point in points}
