"""A row's watches while it runs: scores per position, where they fired, what they did.

A `WatchState` is a reader of the row's residual before the watch's point's edits: it rides the
same taps as residual captures (reading.py), so it runs inside the forward hook on the scheduler
thread, once per forward pass, over the positions that pass fed. It keeps only numbers (the
peak, the firing positions), never vectors. What the row does about a firing (steer from the
next position, or end) is decided by the row between forward passes.
"""

from __future__ import annotations

import torch

from millm.engine.jobs import ProbeVerdict, Watch

KEPT_POSITIONS = (
    256  # firing positions a verdict lists (the first ones); a long row could fire at all of them
)


class WatchState:
    """One watch over one row: its scores so far and, once it fired, its steering window."""

    after_edit = False  # a watch reads the residual before its point's edits

    def __init__(self, watch: Watch, prompt_length: int):
        self.watch, self.prompt_length = watch, prompt_length
        self.point = watch.point
        self.first: int | None = None
        self.peak: float | None = None
        self.peak_position: int | None = None
        self.positions: list[int] = []
        self.steer_from: int | None = None  # steer: the first position its edit applies to
        self.steer_until: int | None = (
            None  # steer: the first position it no longer applies to (None: never)
        )

    def take(self, first: int, hidden: torch.Tensor) -> None:
        """Score the row's positions `[T, d]` (the first at absolute position `first`)."""
        scores = self.watch.score(hidden.float()).tolist()
        threshold = self.watch.threshold
        for offset, score in enumerate(scores):
            position = first + offset
            if position < self.watch.skip:
                continue
            if self.peak is None or score > self.peak:
                self.peak, self.peak_position = score, position
            if score >= threshold:
                self._fired(position)

    def _fired(self, position: int) -> None:
        if len(self.positions) < KEPT_POSITIONS:
            self.positions.append(position)
        if self.first is not None:
            return  # it acts once
        self.first = position
        if self.watch.action == "steer":
            # The prompt is computed once: a firing inside it steers from the first generated
            # position.
            self.steer_from = max(position + 1, self.prompt_length)
            if self.watch.tokens is not None:
                self.steer_until = self.steer_from + self.watch.tokens

    @property
    def aborts(self) -> bool:
        """Whether this watch ends the row (an abort watch that fired)."""
        return self.watch.action == "abort" and self.first is not None

    def steers(self, position: int) -> bool:
        """Whether this watch's edit applies at `position`."""
        if self.steer_from is None or position < self.steer_from:
            return False
        return self.steer_until is None or position < self.steer_until

    def verdict(self, row: int, tokens: list[int], fed: int) -> ProbeVerdict:
        """The event reporting this watch (tokens: the row's prompt then generated ids; fed:
        how many positions the row fed to the model)."""
        acted_at = None
        if self.watch.action == "abort":
            acted_at = self.first
        elif (
            self.steer_from is not None and self.steer_from < fed
        ):  # it steered a position the model saw
            acted_at = self.steer_from
        return ProbeVerdict(
            row=row,
            name=self.watch.name,
            action=self.watch.action,
            fired=self.first is not None,
            first_position=self.first,
            peak=self.peak,
            peak_position=self.peak_position,
            positions=tuple(self.positions),
            token_ids=tuple(tokens[p] for p in self.positions),
            acted_at=acted_at,
        )
