"""Cohen's d and the contrast ranking: against the textbook formula, and the zero-variance cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from millm.interp.separation import cohens_d, favouring, separation


def textbook_d(a: list[float], b: list[float]) -> float:
    """(mean_a - mean_b) / sqrt(((n_a - 1) s_a² + (n_b - 1) s_b²) / (n_a + n_b - 2)), sample
    variances."""
    n_a, n_b = len(a), len(b)
    var_a = np.var(a, ddof=1) if n_a > 1 else 0.0
    var_b = np.var(b, ddof=1) if n_b > 1 else 0.0
    pooled = math.sqrt(((n_a - 1) * var_a + (n_b - 1) * var_b) / (n_a + n_b - 2))
    return (np.mean(a) - np.mean(b)) / pooled


def test_each_column_equals_the_textbook_formula():
    rng = np.random.default_rng(7)
    a, b = rng.gamma(2.0, 1.5, size=(9, 5)), rng.gamma(1.0, 1.0, size=(6, 5))
    d = cohens_d(a, b)
    assert d == pytest.approx(
        [textbook_d(list(a[:, j]), list(b[:, j])) for j in range(5)], rel=1e-12
    )
    found = separation(a, b)
    assert found.mean_a == pytest.approx(a.mean(0)) and found.mean_b == pytest.approx(b.mean(0))
    assert found.difference == pytest.approx(a.mean(0) - b.mean(0))


def test_one_text_in_a_set_uses_the_other_sets_variance():
    a, b = [[4.0]], [[1.0], [2.0], [3.0]]
    assert cohens_d(np.array(a), np.array(b))[0] == pytest.approx(
        textbook_d([4.0], [1.0, 2.0, 3.0])
    )
    assert cohens_d(np.array(a), np.array(b))[0] == pytest.approx(2.0)  # (4 - 2) / sd 1


def test_zero_variance_equal_constants_is_zero_and_different_constants_infinite():
    a = np.array([[0.0, 2.0, 3.0], [0.0, 2.0, 3.0]])
    b = np.array([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
    d = cohens_d(a, b)
    assert d[0] == 0.0 and d[1] == 0.0  # never fires / the same constant in both: no separation
    assert d[2] == math.inf  # constant in each set and different: a perfect separation
    assert cohens_d(b, a)[2] == -math.inf
    assert not np.isnan(d).any()


def test_rounding_in_a_mean_of_equal_values_is_not_read_as_a_variance():
    value = 0.1 + 0.2  # sums of it are not exact multiples
    a = np.full((7, 1), value)
    b = np.full((3, 1), value)
    assert cohens_d(a, b)[0] == 0.0


def test_one_text_a_set_ranks_by_the_difference():
    # no variance to pool: a feature that differs has an infinite d, one that does not has 0
    d = cohens_d(np.array([[2.0, 1.0, 0.0]]), np.array([[0.5, 1.0, 3.0]]))
    assert d.tolist() == [np.inf, 0.0, -np.inf]


def test_an_empty_set_is_refused():
    with pytest.raises(ValueError, match="a text in each set"):
        cohens_d(np.ones((3, 2)), np.zeros((0, 2)))


def test_favouring_ranks_by_effect_size_then_difference_then_index():
    a = np.array([[5.0, 1.0, 0.0, 2.0, 9.0], [6.0, 1.0, 0.0, 3.0, 9.0], [7.0, 1.0, 1.0, 2.0, 9.0]])
    b = np.array([[0.0, 4.0, 0.0, 1.0, 9.0], [1.0, 5.0, 3.0, 1.0, 9.0], [2.0, 6.0, 3.0, 2.0, 9.0]])
    found = separation(a, b)
    for_a, for_b = favouring(found, 10)
    d = found.effect_size
    assert list(for_a) == sorted(np.flatnonzero(d > 0), key=lambda i: -d[i])
    assert list(for_b) == sorted(np.flatnonzero(d < 0), key=lambda i: d[i])
    assert 4 not in for_a and 4 not in for_b  # d == 0: favours neither
    assert list(favouring(found, 1)[0]) == [for_a[0]]
    # Infinite effects come first; equal effects go to the larger |difference|.
    tied = separation(
        np.array([[3.0, 1.0, 2.0], [3.0, 2.0, 4.0]]), np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    )
    assert list(favouring(tied, 3)[0]) == [0, 2, 1]
