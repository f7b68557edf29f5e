"""Steering vectors from contrasting prompt pairs, and their decomposition over an SAE's decoder.

Training (as llama.cpp's cvector-generator and repeng do): both texts of each pair are read at
one residual point, unsteered, and each text is pooled into one vector: the mean of its
residuals over every position but the first. Why that pooling rather than the last position
(which repeng reads):
- position 0 is an attention sink in most models, its residual norm tens of times the others'
  (see lab/discovery/reads.py): it would dominate any mean, so it is left out, as every
  discovery read leaves it out;
- a concept two texts differ by (a topic, a tone, a persona) shows at every position of them,
  while the last position mostly holds the next-token prediction of one text: the mean over
  positions is a steadier estimate from a few pairs, and it is what the SAE reads of inspect,
  contrast and calibration average, so explaining a vector through an SAE compares like with like.

Methods, over the pairs' differences d_i = pooled(positive_i) - pooled(negative_i):
- `mean`: the difference of means, mean_i d_i. The unit vector is its direction, `norm` its length,
  so a strength of `norm` adds exactly the mean difference.
- `pca`: the first right singular vector of the differences [n, d], not centred: the direction u
  maximising Σ_i (d_i · u)², signed to agree with the mean difference. Not centred, unlike
  scikit-learn's PCA (which repeng's pca_diff uses): centring subtracts the mean difference, which
  is the signal; pairs that all differ by the same vector have no variance along it at all. `norm`
  is the mean difference's component along the direction (strength = norm adds that component).

A stored vector is always a unit direction (float32) plus its `norm`: a strength s adds s·û, on
the same ±200 scale as a unit-norm SAE decoder row.

Explaining: the features of an SAE whose unit decoder rows have the largest |cosine| with û, and
the fraction of û they explain: the squared norm of û's least-squares projection onto the span of
their rows (û has norm 1). `cumulative` gives that fraction for the first j features, so a reader
sees how many features it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from millm.errors import InvalidRequest

Method = Literal["mean", "pca"]
METHODS: tuple[Method, ...] = ("mean", "pca")
# A decoder row whose part outside the span of the rows before it is below this fraction of its
# length adds no new direction (float32 rows: rounding leaves about 1e-7 of a repeated row).
INDEPENDENT = 1e-5


def pooled(residuals: torch.Tensor, skip: int) -> np.ndarray:
    """One text's residuals `[T, d]` pooled into one vector: the mean over positions `skip`..
    (float64 numpy `[d]`)."""
    return residuals[skip:].double().mean(dim=0).cpu().numpy()


@dataclass(frozen=True)
class Trained:
    """A trained vector: its unit direction (float32), the length `norm`, and how many pairs
    agree with it."""

    unit: np.ndarray  # [d] float32, norm 1
    norm: float
    method: Method
    pairs: int
    agreement: (
        float  # the fraction of pairs whose difference has a positive component along the direction
    )


def differences(positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """Each pair's difference `[n, d]` (float64), the pooled positive text minus the pooled
    negative one."""
    if positive.shape != negative.shape or positive.ndim != 2 or positive.shape[0] == 0:
        raise ValueError(
            f"positive {positive.shape} and negative {negative.shape} must both be [n >= 1, d]"
        )
    return positive.astype(np.float64) - negative.astype(np.float64)


def mean_direction(diffs: np.ndarray) -> tuple[np.ndarray, float]:
    """The mean difference's unit direction and its length."""
    mean = diffs.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    if not norm > 0:
        raise InvalidRequest(
            "the pairs' mean difference is zero: the positive and negative texts read the same at "
            "this point",
            param="pairs",
        )
    return mean / norm, norm


def principal_direction(diffs: np.ndarray) -> tuple[np.ndarray, float]:
    """The differences' first (uncentred) principal direction, signed to agree with their mean,
    and the mean's component along it."""
    if diffs.shape[0] < 2:
        raise InvalidRequest(
            "method pca needs at least 2 pairs (one difference has no principal direction of its "
            "own)",
            param="pairs",
        )
    mean_direction(diffs)  # refuses pairs that do not differ on average
    _, _, vt = np.linalg.svd(diffs, full_matrices=False)
    direction = vt[0] / np.linalg.norm(vt[0])
    component = float(diffs.mean(axis=0) @ direction)
    if component < 0:
        direction, component = -direction, -component
    if not component > 0:
        raise InvalidRequest(
            "the pairs' principal direction is orthogonal to their mean difference; the pairs "
            "disagree on the direction (use method mean)",
            param="method",
        )
    return direction, component


def train(positive: np.ndarray, negative: np.ndarray, method: Method) -> Trained:
    """A steering vector from pooled positive and negative texts `[n, d]` (pair i is row i of
    each)."""
    diffs = differences(positive, negative)
    direction, norm = mean_direction(diffs) if method == "mean" else principal_direction(diffs)
    unit = direction.astype(np.float32)
    agreement = float(np.mean(diffs @ direction > 0))
    return Trained(unit, norm, method, diffs.shape[0], agreement)


# explaining ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """A feature in a vector's explanation: its cosine with the vector, and the fraction
    explained up to it."""

    index: int
    cosine: float
    cumulative: float


def cumulative_fractions(vector: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For j = 1..k: ‖projection of `vector` onto the span of rows[:j]‖² / ‖vector‖² (float64
    `[k]`).

    Gram-Schmidt in the rows' order, each new row orthogonalised twice against the basis so far
    (twice is enough in floating point, Kahan and Parlett); a row inside the span already (a
    repeated or dead feature) adds nothing.
    """
    v = vector.astype(np.float64)
    total = float(v @ v)
    if not total > 0:
        raise ValueError("the vector is zero")
    basis = np.zeros((0, v.shape[0]))
    captured, out = 0.0, []
    for row in rows.astype(np.float64):
        length = float(np.linalg.norm(row))
        w = row
        for _ in range(2):
            w = w - basis.T @ (basis @ w)
        rest = float(np.linalg.norm(w))
        if length > 0 and rest > INDEPENDENT * length:
            b = w / rest
            basis = np.vstack([basis, b])
            captured += float(b @ v) ** 2
        out.append(min(captured / total, 1.0))
    return np.asarray(out)


def decompose(unit: np.ndarray, decoder_unit: np.ndarray, k: int) -> list[Part]:
    """The k features whose unit decoder rows `[d_sae, d]` have the largest |cosine| with `unit`
    (ties by index), each with its signed cosine and the fraction of the vector the features up
    to it explain."""
    direction = unit.astype(np.float64)
    direction = direction / np.linalg.norm(direction)
    # In the decoder's dtype: a float64 copy of a 16k x 2304 decoder would be 300 MB.
    cosines = (decoder_unit @ direction.astype(decoder_unit.dtype)).astype(np.float64)
    k = min(k, cosines.shape[0])
    magnitude = np.abs(cosines)
    top = (
        np.argpartition(-magnitude, k - 1)[:k]
        if k < cosines.shape[0]
        else np.arange(cosines.shape[0])
    )
    order = top[np.lexsort((top, -magnitude[top]))]
    fractions = cumulative_fractions(direction, decoder_unit[order])
    return [
        Part(int(i), float(cosines[i]), float(f)) for i, f in zip(order, fractions, strict=True)
    ]
