"""Which positions a residual read keeps, without a model."""

import pytest
import torch

from millm.engine.jobs import ResidualRead
from millm.engine.reading import Capture, taps


def capture(positions, prompt_length=4):
    return Capture(ResidualRead(0, True, positions, "activations"), prompt_length)


def feed(cap: Capture, total: int) -> None:
    """A prefill of the prompt, then one column per generated token; row values = position."""
    hidden = torch.arange(total, dtype=torch.float32)[:, None].repeat(1, 3)
    cap.take(0, hidden[: cap.prompt_length])
    for position in range(cap.prompt_length, total):
        cap.take(position, hidden[position : position + 1])


@pytest.mark.parametrize(
    "positions, expected",
    [
        ("all", [0, 1, 2, 3, 4, 5, 6]),
        ("prompt", [0, 1, 2, 3]),
        ("completion", [4, 5, 6]),
        ("last", [6]),
        ((2, 5), [2, 3, 4]),
        ((6, 100), [6]),
        ((50, 60), []),
    ],
)
def test_positions_kept(positions, expected):
    cap = capture(positions)
    feed(cap, 7)
    result = cap.result(0, list(range(100, 107)))
    assert list(result.positions) == expected
    assert list(result.token_ids) == [100 + p for p in expected]
    assert result.residuals.shape[0] == len(expected)
    if expected:
        assert result.residuals[:, 0].tolist() == [float(p) for p in expected]


def test_encode_runs_on_the_captured_vectors():
    read = ResidualRead(0, True, "all", "monitoring", encode=lambda x: x.sum(-1).tolist())
    cap = Capture(read, 2)
    cap.take(0, torch.ones(2, 3))
    assert cap.result(0, [5, 6]).encoded == [3.0, 3.0]


def test_taps_pick_each_rows_real_columns_and_side():
    before, after = capture("all", 2), Capture(ResidualRead(0, False, "all", "monitoring"), 3)
    reader = taps([([before], 0, 2), ([after], 0, 3)])[0]
    pre = torch.zeros(2, 3, 1)
    post = torch.arange(6, dtype=torch.float32).view(2, 3, 1)
    reader(pre, post)  # row 0 is left-padded by one column
    assert before.result(0, [1, 2]).residuals.flatten().tolist() == [
        1.0,
        2.0,
    ]  # after_edit=True reads post
    assert after.result(1, [1, 2, 3]).residuals.flatten().tolist() == [
        0.0,
        0.0,
        0.0,
    ]  # after_edit=False reads pre
