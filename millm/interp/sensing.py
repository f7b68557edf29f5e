"""Sensing, the arithmetic: where a cluster's members fire together in a row (co-activation), and
where a circuit's edge is seen (its upstream feature fires, then its downstream partner within a
few tokens), from the members' activations the engine kept at every position.

A member fires at a position when its activation is above its threshold θ = max(floor, ε ·
max_activation); a member whose document gives no positive max_activation has θ = floor when the
floor is above 0, else it never fires (unsensable). These are the original miLLM's rules
(ε 0.1, floor 0.0), and a reading of activations `[positions, members]` gives the same events
however the engine batched the row, since each row's activations are its own.

Plain Python over lists: it runs on the sensing worker's thread, where torch work would start an
OpenMP pool that slows every decode step (kernel/runtime/threads.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EPSILON = 0.1  # θ = ε · max_activation
THETA_FLOOR = 0.0
UNSENSABLE = math.inf


def member_threshold(max_activation: float | None, epsilon: float, floor: float) -> float:
    """A member's θ: max(floor, ε · max_activation); without a positive max_activation, the floor
    when it is above 0, else +inf (the member never fires)."""
    if max_activation is None or not max_activation > 0:
        return floor if floor > 0 else UNSENSABLE
    return max(floor, epsilon * max_activation)


def threshold_mode(max_activations: Sequence[float | None]) -> str:
    """`floor_only` when no member has a positive max_activation, else `epsilon_max`."""
    known = any(m is not None and m > 0 for m in max_activations)
    return "epsilon_max" if known else "floor_only"


@dataclass(frozen=True)
class CoActivation:
    """Consecutive positions where at least min_k members fired: the span, each fired member's
    peak activation, how many fired, and the score max(peak / θ) over them."""

    pos_start: int
    pos_end: int
    fired_members: tuple[tuple[int, float], ...]  # (feature index, peak activation)
    score: float
    truncated: bool = False

    @property
    def fired_count(self) -> int:
        """How many members fired in the span."""
        return len(self.fired_members)


def co_activations(
    acts: Sequence[Sequence[float]],
    positions: Sequence[int],
    features: Sequence[int],
    thetas: Sequence[float],
    min_k: int,
    cap: int,
) -> list[CoActivation]:
    """The events of one row: `acts` `[n][m]` at `positions` (ascending), member m being feature
    `features[m]` with threshold `thetas[m]`. At most `cap` events; when more would follow, the
    last one kept says `truncated`."""
    fired = [[m for m, act in enumerate(row) if act > thetas[m]] for row in acts]  # inf: never
    spans: list[list[int]] = []  # row indices of each run of consecutive qualifying positions
    for i, firing in enumerate(fired):
        if len(firing) < min_k:
            continue
        if spans and positions[spans[-1][-1]] + 1 == positions[i]:
            spans[-1].append(i)
        else:
            spans.append([i])
    events = []
    for rows in spans[:cap]:
        peaks: dict[int, float] = {}
        for i in rows:
            for m in fired[i]:
                peaks[m] = max(peaks.get(m, -math.inf), float(acts[i][m]))
        members = tuple((features[m], peaks[m]) for m in sorted(peaks))
        score = max(peaks[m] / thetas[m] if thetas[m] > 0 else math.inf for m in peaks)
        events.append(CoActivation(positions[rows[0]], positions[rows[-1]], members, score))
    if len(spans) > cap and events:
        last = events[-1]
        events[-1] = CoActivation(
            last.pos_start, last.pos_end, last.fired_members, last.score, truncated=True
        )
    return events


@dataclass(frozen=True)
class EdgeObservation:
    """An edge seen: the upstream feature fired at `up_pos`, and its downstream partner started
    firing `token_lag` positions later (1 to the lag allowed), peaking at `down_act` over the
    positions it kept firing."""

    up_pos: int
    up_act: float
    down_pos: int
    down_act: float

    @property
    def token_lag(self) -> int:
        """down_pos − up_pos."""
        return self.down_pos - self.up_pos


def edge_observations(
    up: Sequence[float],
    up_theta: float,
    down: Sequence[float],
    down_theta: float,
    positions: Sequence[int],
    max_lag: int,
) -> list[EdgeObservation]:
    """Where an edge is seen in one row: `up` and `down` `[n]` are its endpoints' activations at
    `positions` (ascending). Each run of consecutive downstream firings whose first position q
    has an upstream firing p with 0 < q − p ≤ max_lag (the nearest such p) is one observation; a
    lone upstream firing, a downstream one first, or both at one position are none. One upstream
    firing may open several observations."""
    up_fired = [(positions[i], float(act)) for i, act in enumerate(up) if act > up_theta]
    runs: list[list[int]] = []
    for i, act in enumerate(down):
        if not act > down_theta:
            continue
        if runs and positions[runs[-1][-1]] + 1 == positions[i]:
            runs[-1].append(i)
        else:
            runs.append([i])
    seen = []
    for run in runs:
        start = positions[run[0]]
        before = [(p, act) for p, act in up_fired if p < start]
        if not before or start - before[-1][0] > max_lag:
            continue
        up_pos, up_act = before[-1]
        peak = max(float(down[i]) for i in run)
        seen.append(EdgeObservation(up_pos, up_act, start, peak))
    return seen
