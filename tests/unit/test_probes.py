"""Probe maths: each detector's score against the SAE's own encode (or sigmoid(w·x + b)), the
verdict's rules, binding a detector to what is loaded (and each refusal), and the document
format."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from millm.engine.residual import EMBEDDINGS
from millm.errors import InvalidFeatureIndex, InvalidProbe, InvalidRequest
from millm.formats.probe_documents import probe_bundle, validate_probe, validate_probe_import
from millm.interp.formats import read_sae
from millm.interp.probes import (
    KEPT_POSITIONS,
    ModelShape,
    offline_verdict,
    point_of,
    scorer,
    verdict_of,
)
from millm.interp.steering import Attached
from tests.support.tiny_saes import build_saelens

SHAPE = ModelShape("tiny-llama", 64, 4)


@pytest.fixture(scope="module", params=["topk", "jumprelu", "standard"])
def attached(request, tmp_path_factory) -> dict[str, Attached]:
    info, sae = read_sae(
        build_saelens(
            tmp_path_factory.mktemp("probe-sae") / request.param,
            layer=2,
            architecture=request.param,
            seed=5,
        )
    )
    return {info.id: Attached(info, sae, 2)}


def residuals(n: int = 300, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(seed)) * 3


def no_grids(sae_id: str):
    return None


def test_feature_and_weighted_scores_are_the_saes_own_encode(attached):
    [(sae_id, target)] = attached.items()
    x = residuals()  # more than one encode chunk (256 positions)
    acts = target.sae.encode(x)
    feature = scorer(
        "f",
        {"type": "feature", "sae_id": sae_id, "index": 7, "threshold": 0.5},
        attached,
        no_grids,
        SHAPE,
        "p",
    )
    assert (feature.point, feature.threshold) == (2, 0.5)
    assert torch.equal(feature.score(x), acts[:, 7])
    weighted = {
        "type": "weighted",
        "sae_id": sae_id,
        "features": [{"index": 3, "weight": 2.0}, {"index": 11, "weight": -0.5}],
        "threshold": 1.0,
    }
    got = scorer("w", weighted, attached, no_grids, SHAPE, "p").score(x)
    assert torch.allclose(got, acts[:, 3] * 2.0 - acts[:, 11] * 0.5, atol=1e-6)
    assert got.dtype == torch.float32 and got.shape == (300,)


def test_a_percentile_is_the_calibrations_quantile_at_that_percent(attached):
    [(sae_id, _)] = attached.items()
    grids = np.tile(np.linspace(1.0, 11.0, 101, dtype=np.float32), (128, 1))
    grids[4] = np.nan  # never fired
    detector = {"type": "feature", "sae_id": sae_id, "index": 7, "percentile": 90}
    assert scorer("f", detector, attached, lambda s: grids, SHAPE, "p").threshold == pytest.approx(
        10.0
    )
    with pytest.raises(InvalidRequest, match="never fired") as never:
        scorer(
            "f", {**detector, "index": 4}, attached, lambda s: grids, SHAPE, "probes[1].detector"
        )
    assert (never.value.code, never.value.param) == (
        "not_calibrated",
        "probes[1].detector.percentile",
    )
    with pytest.raises(InvalidRequest, match="POST /api/saes/.*/calibrate") as uncalibrated:
        scorer("f", detector, attached, no_grids, SHAPE, "p")
    assert uncalibrated.value.code == "not_calibrated"


def test_linear_score_is_the_sigmoid_of_the_residuals_projection():
    weights = [math.sin(i) for i in range(64)]
    probe = scorer(
        "l",
        {
            "type": "linear",
            "layer": 1,
            "hook_point": "resid_pre",
            "weights": weights,
            "bias": -0.3,
            "threshold": 0.8,
        },
        {},
        no_grids,
        SHAPE,
        "p",
    )
    x = residuals(10)
    assert (probe.point, probe.threshold) == (0, 0.8)
    assert torch.allclose(probe.score(x), torch.sigmoid(x @ torch.tensor(weights) - 0.3), atol=1e-6)


def test_points_of_hook_points():
    assert [
        point_of(0, "resid_post"),
        point_of(3, "resid_post"),
        point_of(3, "resid_pre"),
        point_of(0, "resid_pre"),
    ] == [0, 3, 2, EMBEDDINGS]


@pytest.mark.parametrize(
    "detector, error, code, param",
    [
        (
            {"type": "feature", "sae_id": "sae_other", "index": 1, "threshold": 1},
            InvalidRequest,
            "sae_not_attached",
            "p.sae_id",
        ),
        (
            {"type": "feature", "sae_id": None, "index": 128, "threshold": 1},
            InvalidFeatureIndex,
            "invalid_feature_index",
            "p.index",
        ),
        (
            {
                "type": "weighted",
                "sae_id": None,
                "features": [{"index": 1, "weight": 1}, {"index": 200, "weight": 1}],
                "threshold": 1,
            },
            InvalidFeatureIndex,
            "invalid_feature_index",
            "p.features[1].index",
        ),
        (
            {"type": "linear", "layer": 1, "weights": [1.0] * 63},
            InvalidRequest,
            "invalid_parameter",
            "p.weights",
        ),
        (
            {"type": "linear", "layer": 4, "weights": [1.0] * 64},
            InvalidRequest,
            "invalid_parameter",
            "p.layer",
        ),
        (
            {"type": "linear", "layer": 1, "weights": [1.0] * 64, "training": {"model": "other"}},
            InvalidRequest,
            "probe_model_mismatch",
            "p.training.model",
        ),
    ],
)
def test_what_does_not_fit_the_loaded_model_is_refused(attached, detector, error, code, param):
    [sae_id] = attached
    if detector.get("sae_id", "") is None:
        detector = {**detector, "sae_id": sae_id}
    detector = {"bias": 0.0, "threshold": 0.5, "hook_point": "resid_post", **detector}
    with pytest.raises(error) as refused:
        scorer("x", detector, attached, no_grids, SHAPE, "p")
    assert (refused.value.code, refused.value.param) == (code, param)


def test_a_verdict_fires_at_or_above_the_threshold_and_peaks_at_the_first_maximum():
    scores = torch.tensor([0.1, 2.0, 0.5, 3.0, 3.0, 1.99])
    verdict = verdict_of(scores, 2.0, (10, 11, 12, 13, 14, 15), (100, 101, 102, 103, 104, 105))
    assert (
        verdict.fired
        and verdict.first_position == 11
        and verdict.positions == (11, 13, 14)
        and verdict.token_ids == (101, 103, 104)
    )
    assert (verdict.peak, verdict.peak_position) == (3.0, 13)
    quiet = verdict_of(scores, 5.0, tuple(range(6)), tuple(range(6)))
    assert (
        quiet.fired,
        quiet.first_position,
        quiet.positions,
        quiet.peak,
        quiet.peak_position,
    ) == (False, None, (), 3.0, 3)
    empty = verdict_of(torch.zeros(0), 1.0, (), ())
    assert (empty.fired, empty.peak, empty.peak_position) == (False, None, None)


def test_a_verdict_keeps_the_first_positions_only():
    n = KEPT_POSITIONS + 44
    verdict = verdict_of(torch.ones(n), 1.0, tuple(range(5, 5 + n)), tuple(range(n)))
    assert (
        len(verdict.positions) == KEPT_POSITIONS
        and verdict.positions[0] == 5
        and verdict.positions[-1] == 5 + KEPT_POSITIONS - 1
    )


def test_an_offline_verdict_scores_the_residuals_it_is_given(attached):
    [(sae_id, target)] = attached.items()
    probe = scorer(
        "f",
        {"type": "feature", "sae_id": sae_id, "index": 2, "threshold": 0.25},
        attached,
        no_grids,
        SHAPE,
        "p",
    )
    x = residuals(40, seed=3)
    acts = target.sae.encode(x)[:, 2]
    verdict = offline_verdict(probe, x, tuple(range(40)), tuple(range(1000, 1040)))
    # position 0 (the attention sink) is never scored
    assert list(verdict.positions) == [i for i in range(1, 40) if acts[i] >= 0.25]
    assert verdict.peak == pytest.approx(
        float(acts[1:].max())
    ) and verdict.peak_position == 1 + int(acts[1:].argmax())


def test_documents_bundles_and_refusals():
    doc = validate_probe(
        {
            "name": "p",
            "detector": {
                "type": "weighted",
                "sae_id": "s",
                "features": [{"index": 1, "weight": 1}],
                "threshold": 2,
            },
        }
    )
    assert doc == {
        "kind": "millm.probe",
        "version": 1,
        "name": "p",
        "description": "",
        "detector": {
            "type": "weighted",
            "sae_id": "s",
            "features": [{"index": 1, "weight": 1.0}],
            "threshold": 2.0,
        },
    }
    assert validate_probe_import(probe_bundle([doc, {**doc, "name": "q"}])) == [
        doc,
        {**doc, "name": "q"},
    ]
    with pytest.raises(InvalidProbe, match="names appear twice: p"):
        validate_probe_import(probe_bundle([doc, doc]))
    with pytest.raises(InvalidProbe, match="probes\\[2\\]\\.detector\\.threshold") as refused:
        validate_probe(
            {**doc, "detector": {**doc["detector"], "threshold": float("inf")}}, prefix="probes[2]"
        )
    assert refused.value.param == "probes[2].detector.threshold"
    with pytest.raises(InvalidProbe, match="version"):
        validate_probe({**doc, "version": 2})
