"""The training's bounded shuffling buffer and its curve: every row given out once, never more held
than the bound, and a curve thinned rather than grown past its size."""

from __future__ import annotations

import pytest
import torch

from millm.interp.activation_buffers import ShuffleBuffer
from millm.interp.dictionary_training import CURVE_POINTS, Progress


def test_every_row_is_given_once_in_shuffled_batches_within_the_bound():
    rows = torch.arange(1000, dtype=torch.float32)[:, None].repeat(1, 4)
    buffer = ShuffleBuffer(128, 4, 16, torch.Generator().manual_seed(0))
    given = []
    for start in range(0, 1000, 37):
        given += buffer.put(rows[start : start + 37])
        assert buffer.filled <= 128 and buffer.rows.shape == (128, 4)
    given += buffer.drain()
    assert all(batch.shape == (16, 4) for batch in given)
    seen = torch.cat(given)[:, 0]
    assert len(seen) == 1000 // 16 * 16  # whole batches; the last partial one is dropped
    assert len(set(seen.tolist())) == len(seen)  # no row twice
    assert seen.tolist() != sorted(seen.tolist())  # shuffled
    assert buffer.filled == 1000 - len(seen)


def test_a_buffer_must_hold_two_batches():
    with pytest.raises(ValueError, match="cannot mix"):
        ShuffleBuffer(31, 4, 16, torch.Generator())


def test_a_long_curve_is_thinned_to_its_bound():
    progress = Progress()
    for step in range(1, 5001):
        progress.steps = step
        progress.record({"step": step})
    assert CURVE_POINTS // 2 <= len(progress.curve) <= CURVE_POINTS
    steps = [point["step"] for point in progress.curve]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] > 4900
