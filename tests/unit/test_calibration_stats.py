"""The calibration's statistics (pure numpy) against brute force; the request body's rules."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from millm.errors import InvalidRequest
from millm.interp.calibration_stats import (
    LEVELS,
    Accumulator,
    FiringValues,
    PercentileTable,
    TopActivations,
    pack_grids,
    percentile_of,
    quantile_grid,
    unpack_grids,
)
from millm.lab.calibration.job import groups
from millm.lab.calibration.protocol import CalibrateRequest, check_source


def sparse_texts(seed: int, texts: int = 12, d_sae: int = 40, width: int = 30):
    """Dense activations `[positions, d_sae]` per text, mostly zero, with a few ties."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(texts):
        dense = rng.exponential(2.0, size=(width, d_sae)).astype(np.float32)
        dense[rng.random((width, d_sae)) < 0.8] = 0.0
        dense[rng.random((width, d_sae)) < 0.02] = 3.0  # ties across texts and positions
        out.append(dense)
    return out


def fold(texts, top_n: int, limit: int = 1 << 24) -> Accumulator:
    accumulator = Accumulator(texts[0].shape[1], top_n, limit=limit)
    for t, dense in enumerate(texts):
        rows, features = np.nonzero(dense)
        accumulator.add(
            t,
            dense.shape[0],
            (rows + 1).astype(np.int32),
            features.astype(np.int32),
            dense[rows, features],
        )
    return accumulator


def test_quantile_grid_is_numpys_linear_quantile_of_each_features_values():
    rng = np.random.default_rng(0)
    features = rng.integers(0, 7, size=500).astype(np.int32)
    values = rng.exponential(3.0, size=500).astype(np.float32)
    grid = quantile_grid(features, values, d_sae=9)
    for f in range(7):
        mine = values[features == f].astype(np.float64)
        assert grid[f] == pytest.approx(np.quantile(mine, LEVELS / 100), rel=1e-12)
    assert np.isnan(grid[7]).all() and np.isnan(grid[8]).all()  # never fired


def test_a_single_value_makes_a_flat_grid():
    grid = quantile_grid(np.array([2], np.int32), np.array([5.0], np.float32), d_sae=3)
    assert (grid[2] == 5.0).all()


def test_percentile_inverts_the_grid_and_is_clamped():
    values = np.random.default_rng(1).gamma(2.0, 2.0, size=4000)
    grid = np.quantile(values, LEVELS / 100)
    for level in (0, 1, 37, 50, 90, 99):
        assert percentile_of(grid, grid[level]) == pytest.approx(level, abs=1e-9)
    assert percentile_of(grid, -1.0) == 0.0
    assert percentile_of(grid, grid[-1]) == 100.0 and percentile_of(grid, grid[-1] * 5) == 100.0
    # Between grid points it is within about a percentile point of the empirical CDF.
    for value in np.linspace(grid[0], grid[-1], 57)[1:-1]:
        assert percentile_of(grid, value) == pytest.approx(100 * np.mean(values <= value), abs=1.0)
    probes = np.linspace(0, grid[-1], 200)
    assert np.all(np.diff([percentile_of(grid, v) for v in probes]) >= 0)  # monotone


def test_repeated_quantiles_give_the_top_of_their_run():
    grid = np.array([1.0] * 50 + [2.0] * 51)  # half the values 1, half 2
    assert percentile_of(grid, 1.0) == 49.0
    assert percentile_of(grid, 1.5) == pytest.approx(49.5)
    assert percentile_of(grid, 0.5) == 0.0


def test_table_lookup_none_for_features_that_never_fired_or_do_not_exist():
    grids = np.full((3, 101), np.nan, np.float32)
    grids[1] = np.linspace(1, 11, 101)
    table = PercentileTable(grids, created_at=0.0)
    assert table.of(1, 6.0) == 50.0 and table.of(1, 100.0) == 100.0 and table.of(1, 0.0) == 0.0
    assert table.of(0, 6.0) is None and table.of(3, 6.0) is None


@pytest.mark.parametrize("top_n", [1, 3, 5])
def test_top_activations_equal_a_brute_force_ranking_with_earlier_ties_first(top_n):
    texts = sparse_texts(2)
    accumulator = fold(texts, top_n)
    for feature in range(texts[0].shape[1]):
        entries = [
            (-float(dense[p, feature]), t, p + 1)
            for t, dense in enumerate(texts)
            for p in range(dense.shape[0])
            if dense[p, feature] > 0
        ]
        # value desc, then text, then position
        want = [(t, p, -v) for v, t, p in sorted(entries)[:top_n]]
        assert accumulator.top.of(feature) == [(t, p, pytest.approx(v)) for t, p, v in want]


def test_top_activations_keep_fewer_for_rare_features_and_none_when_asked_for_none():
    table = TopActivations(d_sae=4, n=3)
    table.offer(
        np.array([2, 2], np.int32), np.array([1.0, 4.0], np.float32), 0, np.array([5, 6], np.int32)
    )
    assert table.of(2) == [(0, 6, 4.0), (0, 5, 1.0)] and table.of(0) == []
    empty = TopActivations(d_sae=4, n=0)
    empty.offer(np.array([1], np.int32), np.array([1.0], np.float32), 0, np.array([1], np.int32))
    assert empty.of(1) == []


def test_totals_equal_brute_force_over_every_position_read():
    texts = sparse_texts(3)
    accumulator = fold(texts, 2)
    figures = accumulator.figures()
    dense = np.concatenate(texts)
    fired = dense > 0
    assert accumulator.totals.positions == dense.shape[0]
    assert figures["count"].tolist() == fired.sum(0).tolist()
    assert figures["frequency"] == pytest.approx(fired.mean(0))
    assert figures["max"] == pytest.approx(dense.max(0))
    for f in range(dense.shape[1]):
        on = dense[fired[:, f], f].astype(np.float64)
        assert figures["mean"][f] == pytest.approx(on.mean())
        assert figures["grid"][f] == pytest.approx(np.quantile(on, LEVELS / 100))


def test_firing_values_are_kept_whole_under_the_bound_then_sampled_uniformly():
    rng = np.random.default_rng(4)
    whole = FiringValues(limit=10_000)
    features = rng.integers(0, 3, 8_000).astype(np.int32)
    values = rng.exponential(1.0, 8_000).astype(np.float32)
    whole.add(features, values)
    assert whole.sample_rate == 1.0 and whole.arrays()[0].shape[0] == 8_000

    sampled = FiringValues(limit=10_000, seed=5)
    for _ in range(10):
        chunk_f = rng.integers(0, 3, 8_000).astype(np.int32)
        # feature f has scale 1 + f
        chunk_v = (rng.exponential(1.0, 8_000) * (1 + chunk_f)).astype(np.float32)
        sampled.add(chunk_f, chunk_v)
    kept_f, kept_v = sampled.arrays()
    assert kept_f.shape[0] <= 10_000 and sampled.sample_rate == 0.125
    assert kept_f.shape[0] == pytest.approx(80_000 * 0.125, rel=0.1)
    for f in range(3):  # exponential median = scale * ln 2
        assert np.median(kept_v[kept_f == f]) == pytest.approx((1 + f) * np.log(2), rel=0.1)


def test_groups_of_texts_stay_within_the_token_budget():
    texts = [np.zeros(n, np.int32) for n in (100, 100, 100, 300, 20, 20)]
    assert groups(texts, budget=256) == [[0, 1], [2], [3], [4, 5]]
    assert groups([], budget=256) == []


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"corpus": "mine"}, "corpus"),
        ({"texts": [""]}, "at least 1 character"),
        ({"texts": ["a"], "top_examples": 21}, "less than or equal to 20"),
        ({"texts": ["a"], "max_tokens_per_text": 1}, "greater than or equal to 2"),
        ({"texts": ["a"], "colour": "blue"}, "Extra inputs"),
        ({"conversations": [[{"role": "user", "content": "hi", "name": "x"}]]}, "Extra inputs"),
        ({"conversations": [[]]}, "at least 1 item"),
        ({"texts": "just one"}, "list"),
    ],
)
def test_request_bodies_refused(body, needle):
    with pytest.raises(ValidationError) as caught:
        CalibrateRequest.model_validate(body)
    assert needle in str(caught.value)


def test_request_defaults():
    request = CalibrateRequest.model_validate(
        {"texts": ["a"], "conversations": [[{"role": "user", "content": "hi"}]]}
    )
    assert (request.top_examples, request.max_tokens_per_text, request.corpus) == (5, 256, None)


def test_grids_pack_exactly_and_keep_never_fired_rows():
    grids = np.random.default_rng(6).random((5, 101)).astype(np.float32)
    grids[2] = np.nan
    packed = pack_grids(grids)
    assert packed["shape"] == [5, 101] and packed["dtype"] == "float32"
    back = unpack_grids(packed)
    assert np.array_equal(back, grids, equal_nan=True)
    with pytest.raises(ValueError):
        unpack_grids({**packed, "shape": [5, 100]})


@pytest.mark.parametrize(
    "body, param, needle",
    [
        ({}, "texts", "give corpus"),
        ({"texts": [], "conversations": []}, "texts", "at least one text"),
        ({"corpus": "demo", "texts": ["a"]}, "corpus", "not both"),
    ],
)
def test_a_request_names_one_source(body, param, needle):
    with pytest.raises(InvalidRequest) as caught:
        check_source(CalibrateRequest.model_validate(body))
    assert caught.value.param == param and needle in caught.value.message
    check_source(CalibrateRequest.model_validate({"corpus": "demo"}))
    check_source(
        CalibrateRequest.model_validate(
            {"texts": [], "conversations": [[{"role": "user", "content": "hi"}]]}
        )
    )
