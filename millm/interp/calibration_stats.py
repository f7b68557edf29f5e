"""A calibration's statistics in numpy: what a feature's activations look like over a corpus.

Every figure is over the positions read (every token of every text but the first, see
lab/discovery/reads.py). A feature *fires* at a position when its activation there is above 0.
`count`, `frequency`, `mean` and `max` are exact. The quantiles (p50, p90, p99 and the grid the
percentiles are read from) are over the positions where the feature fired: for a sparse feature
most positions are 0, so quantiles over all positions would be 0 too and say nothing. They are
numpy's default (linear) quantiles of the kept firing values, which are all of them while they
fit `limit` (a TopK SAE under MILLM_CALIBRATION_MAX_TOKENS always fits); past it, a uniform
random sample of them (seeded), halved each time the bound is reached, which keeps the memory
bounded for SAEs that fire on many features per token (ReLU, JumpReLU).

No torch here: the job's thread and the scheduler's summaries use it alike.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np

LEVELS = np.arange(101, dtype=np.float64)  # the percentile grid: every whole percent
MAX_FIRING_VALUES = 1 << 24  # (feature, value) pairs kept whole: 128 MB of int32 + float32


class FiringValues:
    """The (feature, value) pairs where features fired: all of them up to `limit`, then a uniform
    sample."""

    def __init__(self, limit: int = MAX_FIRING_VALUES, seed: int = 0):
        self.limit = limit
        self.halvings = 0  # each kept pair stands for 2**halvings firings
        self._features: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._kept = 0
        self._rng = np.random.default_rng(seed)

    @property
    def sample_rate(self) -> float:
        """The fraction of firing values kept (1.0: every one)."""
        return 0.5**self.halvings

    def add(self, features: np.ndarray, values: np.ndarray) -> None:
        """Keep these pairs (each with the current sample rate)."""
        if self.halvings:
            keep = self._rng.random(features.shape[0]) < self.sample_rate
            features, values = features[keep], values[keep]
        self._features.append(features.astype(np.int32, copy=False))
        self._values.append(values.astype(np.float32, copy=False))
        self._kept += features.shape[0]
        while self._kept > self.limit:
            self._halve()

    def _halve(self) -> None:
        features, values = self.arrays()
        keep = self._rng.random(features.shape[0]) < 0.5
        self._features, self._values = [features[keep]], [values[keep]]
        self._kept = int(np.count_nonzero(keep))
        self.halvings += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every kept pair as two arrays (features int32, values float32)."""
        if not self._features:
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        features, values = np.concatenate(self._features), np.concatenate(self._values)
        self._features, self._values = [features], [values]
        return features, values


def quantile_grid(
    features: np.ndarray, values: np.ndarray, d_sae: int, levels: np.ndarray = LEVELS
) -> np.ndarray:
    """Per feature, numpy's linear quantiles of its values at `levels` (percent): `[d_sae,
    len(levels)]`, NaN for a feature without values."""
    order = np.lexsort((values, features))  # by feature, then value
    ordered = values[order].astype(np.float64)
    counts = np.bincount(features, minlength=d_sae)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    grid = np.full((d_sae, len(levels)), np.nan)
    fired = counts > 0
    # numpy's "linear" method: the value at h = (n - 1) * q, interpolated between its neighbours
    h = (counts[fired, None] - 1) * (levels[None, :] / 100.0)
    low = np.floor(h).astype(np.int64)
    high = np.minimum(low + 1, counts[fired, None] - 1)
    base = starts[fired, None]
    below, above = ordered[base + low], ordered[base + high]
    grid[fired] = below + (above - below) * (h - low)
    return grid


def percentile_of(grid: np.ndarray, value: float) -> float:
    """Where `value` falls among a feature's firing values, 0-100, from its quantile grid at whole
    percents (the inverse of the piecewise-linear quantile function; exact at the grid's points)."""
    if value < grid[0]:
        return 0.0
    if value >= grid[-1]:
        return 100.0
    i = int(np.searchsorted(grid, value, side="right")) - 1
    low, high = float(grid[i]), float(grid[i + 1])
    return float(LEVELS[i] + (LEVELS[i + 1] - LEVELS[i]) * (value - low) / (high - low))


def pack_grids(grids: np.ndarray) -> dict:
    """Quantile grids `[d_sae, 101]` as JSON: exact float32, little-endian, base64 (NaN rows: never
    fired); a third of the size of the numbers written out, and runs of equal quantiles stay
    equal."""
    data = np.ascontiguousarray(grids, dtype="<f4")
    return {
        "dtype": "float32",
        "shape": list(data.shape),
        "levels": "0..100",
        "base64": base64.b64encode(data.tobytes()).decode("ascii"),
    }


def pack_corpus(texts: list[np.ndarray]) -> dict:
    """A corpus's token ids as JSON: every text's int32 ids, little-endian, base64, and each
    text's length."""
    data = (
        np.concatenate([np.asarray(t, dtype="<i4") for t in texts]) if texts else np.zeros(0, "<i4")
    )
    return {
        "dtype": "int32",
        "lengths": [len(t) for t in texts],
        "base64": base64.b64encode(data.tobytes()).decode("ascii"),
    }


def unpack_corpus(packed: dict) -> list[np.ndarray]:
    """The texts `pack_corpus` wrote (ValueError when they are not such)."""
    if packed.get("dtype") != "int32" or not isinstance(packed.get("lengths"), list):
        raise ValueError("a corpus is int32 token ids with each text's length")
    data = np.frombuffer(base64.b64decode(packed["base64"]), dtype="<i4").astype(np.int32)
    if sum(packed["lengths"]) != data.size:
        raise ValueError("the corpus's lengths do not add up to its ids")
    ends = np.cumsum(packed["lengths"])
    return [data[end - n : end] for n, end in zip(packed["lengths"], ends, strict=True)]


def unpack_grids(packed: dict) -> np.ndarray:
    """The grids `pack_grids` wrote (ValueError when they are not such)."""
    if (
        packed.get("dtype") != "float32"
        or len(packed.get("shape", [])) != 2
        or packed["shape"][1] != len(LEVELS)
    ):
        raise ValueError("grids are not float32 [d_sae, 101]")
    return (
        np.frombuffer(base64.b64decode(packed["base64"]), dtype="<f4")
        .reshape(packed["shape"])
        .astype(np.float32)
    )


@dataclass(frozen=True)
class PercentileTable:
    """One calibration's quantile grids `[d_sae, 101]` (NaN rows: never fired), for
    per-activation percentiles."""

    grids: np.ndarray
    created_at: float

    def of(self, feature: int, value: float) -> float | None:
        """The percentile of `value` among the feature's firing values, to 0.01 (None: it never
        fired in the corpus)."""
        if not 0 <= feature < self.grids.shape[0]:
            return None
        grid = self.grids[feature]
        if np.isnan(grid[0]):
            return None
        return round(percentile_of(grid, value), 2)


class TopActivations:
    """Each feature's `n` largest activations and where they were (text, position); ties keep the
    earlier."""

    def __init__(self, d_sae: int, n: int):
        self.n = n
        self.values = np.full((d_sae, n), -np.inf, np.float32)  # descending per row
        self.texts = np.full((d_sae, n), -1, np.int32)
        self.positions = np.full((d_sae, n), -1, np.int32)

    def offer(
        self, features: np.ndarray, values: np.ndarray, text: int, positions: np.ndarray
    ) -> None:
        """Consider one text's firings; only features whose table they would enter are touched."""
        if self.n == 0:
            return
        better = values > self.values[features, -1]
        if not better.any():
            return
        features, values, positions = features[better], values[better], positions[better]
        touched = np.unique(features)
        n = self.n
        all_f = np.concatenate((np.repeat(touched, n), features))
        all_v = np.concatenate((self.values[touched].ravel(), values))
        all_t = np.concatenate(
            (self.texts[touched].ravel(), np.full(features.shape[0], text, np.int32))
        )
        all_p = np.concatenate((self.positions[touched].ravel(), positions.astype(np.int32)))
        # stable: the table's own entries stay ahead of equal new ones
        order = np.lexsort((-all_v, all_f))
        ranked = all_f[order]
        rank = np.arange(ranked.shape[0]) - np.searchsorted(ranked, ranked, side="left")
        # exactly n per touched feature (its old row had n), in feature order
        keep = order[rank < n]
        self.values[touched] = all_v[keep].reshape(-1, n)
        self.texts[touched] = all_t[keep].reshape(-1, n)
        self.positions[touched] = all_p[keep].reshape(-1, n)

    def of(self, feature: int) -> list[tuple[int, int, float]]:
        """(text, position, activation) of the feature's entries, largest first."""
        row = self.values[feature]
        return [
            (int(self.texts[feature, j]), int(self.positions[feature, j]), float(row[j]))
            for j in range(self.n)
            if np.isfinite(row[j])
        ]


@dataclass
class Totals:
    """Per feature: positions where it fired, their sum and the largest value; and positions
    read."""

    counts: np.ndarray
    sums: np.ndarray
    maxima: np.ndarray
    positions: int = 0


class Accumulator:
    """What a calibration folds every text's firings into."""

    def __init__(self, d_sae: int, top_n: int, limit: int = MAX_FIRING_VALUES, seed: int = 0):
        self.d_sae = d_sae
        self.totals = Totals(
            np.zeros(d_sae, np.int64), np.zeros(d_sae, np.float64), np.zeros(d_sae, np.float32)
        )
        self.firing = FiringValues(limit, seed)
        self.top = TopActivations(d_sae, top_n)

    def add(
        self, text: int, read: int, positions: np.ndarray, features: np.ndarray, values: np.ndarray
    ) -> None:
        """One text: `read` positions were read; the features fired at `positions` with `values`."""
        totals = self.totals
        totals.positions += read
        totals.counts += np.bincount(features, minlength=self.d_sae)
        totals.sums += np.bincount(
            features, weights=values.astype(np.float64), minlength=self.d_sae
        )
        np.maximum.at(totals.maxima, features, values)
        self.firing.add(features, values)
        self.top.offer(features, values, text, positions)

    def figures(self) -> dict:
        """Arrays per feature: count, frequency, mean (where it fired), max, the quantile grid."""
        totals = self.totals
        features, values = self.firing.arrays()
        counts = totals.counts
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(counts > 0, totals.sums / np.maximum(counts, 1), np.nan)
        return {
            "count": counts,
            "frequency": counts / totals.positions if totals.positions else np.zeros(self.d_sae),
            "mean": mean,
            "max": totals.maxima.astype(np.float64),
            "grid": quantile_grid(features, values, self.d_sae),
        }
