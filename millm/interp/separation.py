"""How well each feature separates two sets of texts: difference of means and Cohen's d (numpy
only).

Each set is a `[texts, features]` array of per-text aggregates (a feature's max or mean over a
text's read positions). Cohen's d divides the difference of the set means by the pooled standard
deviation, sqrt(((n_a - 1) s_a² + (n_b - 1) s_b²) / (n_a + n_b - 2)), with sample variances s².

Where the pooled deviation is zero both sets are constant for that feature: d is 0 when the two
constants are equal, and ±inf when they differ (the feature tells every text of one set from every
text of the other, the best separation there is). Constancy is tested exactly (max == min), and
the constants compared as they are, not through variances and means: a float mean of equal
values can differ from them by rounding, which would turn a zero variance into 1e-30 and d into
nonsense.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Separation:
    """Per feature: each set's mean, their difference (a - b) and the effect size (Cohen's d, may
    be ±inf)."""

    mean_a: np.ndarray
    mean_b: np.ndarray
    difference: np.ndarray
    effect_size: np.ndarray


def cohens_d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cohen's d of each column of `a` [n_a, f] against `b` [n_b, f] with the pooled standard
    deviation (0 where both sets are constant and equal, ±inf where they are constant and
    differ). One text a set is enough: with no variance to pool, every feature is constant within
    each set, so one that differs at all has an infinite d and the ranking falls to the difference
    (Goodfire's contrast took a single pair)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n_a, n_b = a.shape[0], b.shape[0]
    if n_a < 1 or n_b < 1:
        raise ValueError(f"Cohen's d needs a text in each set, got {n_a} and {n_b}")
    difference = a.mean(axis=0) - b.mean(axis=0)
    # sums of squared deviations from each set's mean
    squares = a.var(axis=0) * n_a + b.var(axis=0) * n_b
    # With one text a set every column is constant, and the pooled deviation is not used.
    pooled = np.sqrt(squares / max(n_a + n_b - 2, 1))
    constant = (a.max(axis=0) == a.min(axis=0)) & (b.max(axis=0) == b.min(axis=0))
    usable = ~constant & (pooled > 0)
    d = np.zeros_like(difference)
    d[usable] = difference[usable] / pooled[usable]
    # Both constant: compare the constants themselves (their means may differ by rounding alone).
    gap = a.max(axis=0) - b.max(axis=0)
    apart = constant & (gap != 0)
    d[apart] = np.copysign(np.inf, gap[apart])
    return d


def separation(a: np.ndarray, b: np.ndarray) -> Separation:
    """Means, difference and Cohen's d of every feature between the sets `a` [n_a, f] and `b`
    [n_b, f]."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    mean_a, mean_b = a.mean(axis=0), b.mean(axis=0)
    return Separation(mean_a, mean_b, mean_a - mean_b, cohens_d(a, b))


def favouring(found: Separation, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The feature indices with the largest effect size for a (d > 0) and for b (d < 0), top_k of
    each, strongest first; ties go to the larger |difference|, then the lower index."""
    d, spread = found.effect_size, np.abs(found.difference)
    for_a = np.flatnonzero(d > 0)
    for_b = np.flatnonzero(d < 0)
    # lexsort: the last key is the primary one
    order_a = np.lexsort((for_a, -spread[for_a], -d[for_a]))
    order_b = np.lexsort((for_b, -spread[for_b], d[for_b]))
    return for_a[order_a][:top_k], for_b[order_b][:top_k]
