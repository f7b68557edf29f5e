"""Sensing's arithmetic (millm/interp/sensing.py) on hand-made activations: the original miLLM's
acceptance numbers for quorum, spans, the per-request cap and edge lags."""

from __future__ import annotations

import math

import pytest

from millm.interp.sensing import (
    co_activations,
    edge_observations,
    member_threshold,
    threshold_mode,
)


def test_a_members_threshold_is_epsilon_of_its_max_or_the_floor():
    assert member_threshold(20.0, 0.1, 0.0) == pytest.approx(2.0)
    assert member_threshold(20.0, 0.1, 3.0) == 3.0
    assert member_threshold(None, 0.1, 0.0) == math.inf  # unsensable
    assert member_threshold(-1.0, 0.1, 0.5) == 0.5
    assert threshold_mode([None, 0.0]) == "floor_only"
    assert threshold_mode([None, 4.0]) == "epsilon_max"


def rows(*fired_sets, members=3, value=5.0):
    return [[value if m in fired else 0.0 for m in range(members)] for fired in fired_sets]


def test_the_quorum_counts_members_firing_at_one_position():
    acts = rows({0, 1}, {0, 1, 2}, set())
    thetas = [1.0, 1.0, 1.0]
    [event] = co_activations(acts, [4, 5, 6], [10, 11, 12], thetas, min_k=3, cap=20)
    assert (event.pos_start, event.pos_end, event.fired_count) == (5, 5, 3)
    assert event.fired_members == ((10, 5.0), (11, 5.0), (12, 5.0)) and event.score == 5.0
    two = co_activations(acts, [4, 5, 6], [10, 11, 12], thetas, min_k=2, cap=20)
    assert [(e.pos_start, e.pos_end) for e in two] == [(4, 5)]


def test_consecutive_positions_make_one_event_and_a_gap_another():
    acts = rows(*([{0, 1, 2}] * 30), {0}, {0, 1, 2})
    positions = list(range(1, 33))
    events = co_activations(acts, positions, [1, 2, 3], [1.0, 2.0, 4.0], min_k=3, cap=20)
    assert [(e.pos_start, e.pos_end) for e in events] == [(1, 30), (32, 32)]
    assert events[0].score == 5.0  # max(act / θ): 5 / 1
    # a position the engine did not feed breaks a span
    split = co_activations(rows({0, 1, 2}, {0, 1, 2}), [3, 5], [1, 2, 3], [1.0] * 3, 3, 20)
    assert len(split) == 2


def test_past_the_cap_only_the_last_event_says_truncated():
    fired = [{0, 1, 2} if i % 2 == 0 else set() for i in range(60)]
    events = co_activations(rows(*fired), list(range(60)), [1, 2, 3], [1.0] * 3, 3, 20)
    assert len(events) == 20 and [e.truncated for e in events] == [False] * 19 + [True]
    exact = co_activations(rows(*fired[:40]), list(range(40)), [1, 2, 3], [1.0] * 3, 3, 20)
    assert len(exact) == 20 and not any(e.truncated for e in exact)


def edge(up_at: list[int], down_at: list[int], n: int = 40, lag: int = 8):
    up = [3.0 if i in up_at else 0.0 for i in range(n)]
    down = [0.0] * n
    for rank, i in enumerate(down_at):
        down[i] = rank + 2.0
    return edge_observations(up, 1.0, down, 1.0, list(range(n)), lag)


@pytest.mark.parametrize(
    ("up_at", "down_at", "lags"),
    [
        ([10], [12], [2]),
        ([10], [18], [8]),
        ([10], [19], []),  # lag 9 > 8
        ([10], [7], []),  # down before up
        ([10], [10], []),  # the same position
        ([10], [], []),  # up alone
        ([10, 15], [17], [2]),  # the nearest antecedent
        ([10], [12, 16], [2, 6]),  # one upstream firing opens several
    ],
)
def test_an_edge_is_seen_within_the_lag_after_its_upstream_feature(up_at, down_at, lags):
    assert [o.token_lag for o in edge(up_at, down_at)] == lags


def test_a_downstream_run_is_one_observation_at_its_peak():
    [seen] = edge([10], [12, 13, 14])
    assert (seen.up_pos, seen.down_pos, seen.up_act, seen.down_act) == (10, 12, 3.0, 4.0)
