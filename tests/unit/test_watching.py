"""A watch's state without a model: scores per position, firing, steering window, verdict."""

import torch

from millm.engine.jobs import Watch
from millm.engine.residual import ResidualEdit
from millm.engine.watching import KEPT_POSITIONS, WatchState

EDIT = ResidualEdit(((0, torch.zeros(2)),))


def first_column(h: torch.Tensor) -> torch.Tensor:
    return h[:, 0]


def feed(state: WatchState, scores: list[float], prompt_length: int) -> None:
    """A prefill of the prompt's scores, then one position per step (the score is column 0)."""
    hidden = torch.tensor(scores)[:, None].repeat(1, 2)
    state.take(0, hidden[:prompt_length])
    for position in range(prompt_length, len(scores)):
        state.take(position, hidden[position : position + 1])


def test_report_verdict_lists_firings_peak_and_tokens():
    state = WatchState(Watch("w", 0, first_column, 1.0), 3)
    feed(state, [0.0, 1.5, 0.2, 3.0, 1.0, -4.0], 3)
    verdict = state.verdict(7, [10, 11, 12, 13, 14, 15, 16], fed=6)
    assert (verdict.row, verdict.fired, verdict.first_position, verdict.acted_at) == (
        7,
        True,
        1,
        None,
    )
    assert verdict.positions == (1, 3, 4) and verdict.token_ids == (11, 13, 14)
    assert (verdict.peak, verdict.peak_position) == (3.0, 3)


def test_steer_window_starts_after_the_firing_and_lasts_its_tokens():
    state = WatchState(Watch("w", 0, first_column, 1.0, "steer", edit=EDIT, tokens=2), 3)
    feed(state, [0.0, 0.0, 0.0, 0.0, 2.0], 3)
    assert [state.steers(p) for p in range(4, 9)] == [False, True, True, False, False]
    assert state.verdict(0, list(range(9)), fed=5).acted_at is None  # position 5 was never fed
    assert state.verdict(0, list(range(9)), fed=6).acted_at == 5


def test_a_firing_in_the_prompt_steers_from_the_first_generated_position():
    state = WatchState(Watch("w", 0, first_column, 1.0, "steer", edit=EDIT), 4)
    feed(state, [2.0, 0.0, 0.0, 0.0], 4)
    assert not state.steers(3) and state.steers(4) and state.steers(400)


def test_abort_acts_at_the_first_firing_and_positions_are_capped():
    state = WatchState(Watch("w", 0, first_column, 0.0, "abort"), 400)
    feed(state, [1.0] * 400, 400)
    verdict = state.verdict(0, [5] * 400, fed=400)
    assert state.aborts and verdict.acted_at == 0
    assert len(verdict.positions) == KEPT_POSITIONS == 256 and verdict.positions[-1] == 255


def test_a_watch_that_never_fires_reports_its_peak_only():
    state = WatchState(Watch("w", 0, first_column, 9.0, "abort"), 2)
    feed(state, [1.0, 2.0, 0.5], 2)
    verdict = state.verdict(0, [1, 2, 3], fed=3)
    assert (
        not state.aborts
        and not verdict.fired
        and verdict.positions == ()
        and verdict.acted_at is None
    )
    assert (verdict.peak, verdict.peak_position) == (2.0, 1)
