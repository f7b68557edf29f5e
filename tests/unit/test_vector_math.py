"""Steering-vector maths (interp/vectors.py) and the vector file (formats/vector_file.py), against
direct numpy computations: difference of means, the uncentred principal direction and its sign,
the pooling, the explained fractions against least squares, and the file's bit-for-bit round
trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from millm.errors import InvalidRequest
from millm.formats.document_fields import validate_field
from millm.formats.vector_file import VectorFile, file_of, values_of
from millm.interp.vectors import cumulative_fractions, decompose, pooled, train

D = 16


def pairs(n: int, seed: int = 0, shift: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    negative = rng.normal(size=(n, D))
    positive = (
        negative
        + (shift if shift is not None else rng.normal(size=D))
        + 0.1 * rng.normal(size=(n, D))
    )
    return positive, negative


def test_mean_is_the_difference_of_means_as_a_unit_vector_and_its_norm():
    positive, negative = pairs(5)
    trained = train(positive, negative, "mean")
    expected = positive.mean(axis=0) - negative.mean(axis=0)
    assert trained.unit.dtype == np.float32 and trained.unit.shape == (D,)
    assert trained.norm == pytest.approx(float(np.linalg.norm(expected)), rel=1e-12)
    np.testing.assert_allclose(
        trained.norm * trained.unit.astype(np.float64), expected, rtol=0, atol=1e-6 * trained.norm
    )
    assert abs(float(np.linalg.norm(trained.unit.astype(np.float64))) - 1.0) < 1e-6
    assert trained.pairs == 5 and trained.method == "mean"
    assert trained.agreement == pytest.approx(float(np.mean((positive - negative) @ expected > 0)))


def test_pca_is_the_uncentred_first_principal_direction_signed_towards_the_mean():
    rng = np.random.default_rng(3)
    concept = rng.normal(size=D)
    concept /= np.linalg.norm(concept)
    # Every pair differs along the concept by a varying amount, plus a little noise: centred PCA
    # would find the noise (the concept's variance is that of the amounts), uncentred finds the
    # concept.
    amounts = np.array([1.0, 1.2, 0.8, 1.1, 0.9, 1.05])
    negative = rng.normal(size=(6, D))
    positive = negative + amounts[:, None] * concept + 0.05 * rng.normal(size=(6, D))
    trained = train(positive, negative, "pca")
    diffs = positive - negative
    eigenvalues, eigenvectors = np.linalg.eigh(diffs.T @ diffs)  # uncentred second moment
    top = eigenvectors[:, -1] * np.sign(eigenvectors[:, -1] @ diffs.mean(axis=0))
    assert trained.unit.shape == (D,) and trained.method == "pca"
    np.testing.assert_allclose(trained.unit, top, atol=1e-6)
    assert float(trained.unit @ concept) > 0.99
    assert trained.norm == pytest.approx(float(diffs.mean(axis=0) @ top), rel=1e-6)
    flipped = train(negative, positive, "pca")  # swapping the sides flips the sign, not the axis
    np.testing.assert_allclose(flipped.unit, -trained.unit, atol=1e-6)
    assert flipped.norm == pytest.approx(trained.norm, rel=1e-9)


def test_pca_needs_two_pairs_and_pairs_must_differ():
    positive, negative = pairs(1)
    with pytest.raises(InvalidRequest) as refused:
        train(positive, negative, "pca")
    assert refused.value.param == "pairs"
    with pytest.raises(InvalidRequest, match="mean difference is zero"):
        train(negative, negative.copy(), "mean")


def test_pooling_is_the_mean_over_positions_after_the_first():
    residuals = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    residuals[0] = 1e4  # the attention sink: left out
    np.testing.assert_array_equal(pooled(residuals, 1), np.array([6.0, 7.0, 8.0]))


def projection_fraction(vector: np.ndarray, rows: np.ndarray) -> float:
    coefficients, *_ = np.linalg.lstsq(rows.T, vector, rcond=None)
    projection = rows.T @ coefficients
    return float(projection @ projection / (vector @ vector))


def test_cumulative_fractions_equal_least_squares_projections_and_repeats_add_nothing():
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(5, D))
    rows = np.vstack([rows[:3], rows[1:2] * 2.0, rows[3:]])  # row 3 repeats row 1
    vector = rng.normal(size=D)
    fractions = cumulative_fractions(vector, rows)
    expected = [projection_fraction(vector, rows[: j + 1]) for j in range(len(rows))]
    np.testing.assert_allclose(fractions, expected, atol=1e-12)
    assert fractions[3] == fractions[2]
    full = rng.normal(size=(D, D))  # a basis: the whole vector
    assert cumulative_fractions(vector, full)[-1] == pytest.approx(1.0, abs=1e-12)


def test_decompose_ranks_by_absolute_cosine_with_signed_cosines():
    rng = np.random.default_rng(11)
    rows = rng.normal(size=(40, D))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    unit = (0.8 * rows[5] - 0.6 * rows[9]).astype(np.float32)
    unit /= np.linalg.norm(unit)
    parts = decompose(unit, rows.astype(np.float32), 4)
    cosines = rows @ unit.astype(np.float64)
    expected = sorted(range(40), key=lambda i: (-abs(cosines[i]), i))[:4]
    assert [p.index for p in parts] == expected
    for part in parts:
        assert part.cosine == pytest.approx(float(cosines[part.index]), abs=1e-6)
    assert parts[-1].cumulative == pytest.approx(
        projection_fraction(unit.astype(np.float64), rows[expected]), abs=1e-6
    )
    assert set(expected[:2]) == {5, 9} and parts[1].cumulative == pytest.approx(1.0, abs=1e-6)


# the file -----------------------------------------------------------------------------------------
def stored(d: int = D, seed: int = 1) -> tuple[dict, np.ndarray]:
    unit = np.random.default_rng(seed).normal(size=d).astype(np.float32)
    unit /= np.linalg.norm(unit)
    meta = {
        "name": "pirate",
        "description": "",
        "model": "tiny-llama",
        "layer": 1,
        "hook_point": "resid_post",
        "norm": 3.0517578125e-05 + 2.5,
        "d_model": d,
        "method": "mean",
        "pairs": 4,
    }
    return meta, unit


def test_a_file_reads_back_bit_for_bit_through_json():
    meta, unit = stored()
    text = json.dumps(file_of(meta, unit))
    document = validate_field(VectorFile, json.loads(text))
    assert values_of(document).tobytes() == unit.tobytes()
    assert document.norm == meta["norm"]
    assert (
        json.dumps(
            file_of({**meta, **document.model_dump(exclude={"values"})}, values_of(document))
        )
        == text
    )


@pytest.mark.parametrize(
    "change, param, phrase",
    [
        ({"values": [0.5] * (D - 1)}, "values", "must hold d_model = 16 values, got 15"),
        ({"values": [1.0] * D}, "values", "needs values of norm 1, got 4"),
        ({"values": [float("nan")] + [0.0] * (D - 1)}, "values[0]", "finite number"),
        ({"norm": float("inf")}, "norm", "finite number"),
        ({"colour": "red"}, "colour", "unknown key"),
        ({"normalisation": "none"}, "normalisation", "'unit'"),
        ({"kind": "millm.profile"}, "kind", "millm.steering-vector"),
        ({"version": 2}, "version", "1"),
        ({"d_model": 0}, "d_model", "greater than or equal to 1"),
        ({"hook_point": "attn_out"}, "hook_point", "resid_post"),
        ({"layer": "1"}, "layer", "integer"),
        ({"name": ""}, "name", "1-120 characters"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(change, param, phrase):
    meta, unit = stored()
    document = {**file_of(meta, unit), **change}
    with pytest.raises(InvalidRequest) as refused:
        validate_field(VectorFile, document)
    assert refused.value.param == param and phrase in refused.value.message, refused.value.message
