"""Probes' maths: a named detector over one attached SAE or the raw residual, scored and judged
(its documents are in formats/probe_documents.py).

    {"kind": "millm.probe", "version": 1, "name": "...", "description": "...", "detector": {...}}

A bundle is {"kind": "millm.probe-bundle", "version": 1, "probes": [<document>, ...]}. Three
detectors, told apart by `type`:

- feature: one feature of an SAE; it fires where the feature's activation (the SAE's own
  encode) reaches `threshold`, or the feature's `percentile` (a whole percent, 1-99) of its
  firing activations in the SAE's calibration on the loaded model.
- weighted: Σ weight_i · activation_i over some features of one SAE, against `threshold`.
- linear: a logistic probe on the raw residual at `layer`/`hook_point`: sigmoid(w·x + b),
  against `threshold` (a probability), with how it was trained when it was.

A score is computed per position of a residual `[n, d]`; a probe fires at every position whose
score is at least its threshold. The same functions score inside the engine (a Watch) and
offline on captured residuals (`offline_verdict`), so the two agree by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from millm.engine.jobs import ProbeVerdict, Watch
from millm.engine.residual import EMBEDDINGS
from millm.engine.watching import KEPT_POSITIONS
from millm.errors import InvalidRequest
from millm.interp.sae_reads import ENCODE_CHUNK
from millm.interp.steering import Attached, check_feature

# ---- scores ---------------------------------------------------------------------------------
# residuals [n, d] -> one score per position [n] (float32, CPU)
Score = Callable[[torch.Tensor], torch.Tensor]


def feature_score(attached: Attached, indices: list[int], weights: list[float] | None) -> Score:
    """The SAE's own encode (its activation: ReLU, JumpReLU, TopK), then one feature's
    activation, or Σ weight_i · activation_i of several."""
    sae = attached.sae
    device = sae.W_enc.device
    index = torch.tensor(indices, dtype=torch.long, device=device)
    weight = None if weights is None else torch.tensor(weights, dtype=torch.float32, device=device)

    def score(residuals: torch.Tensor) -> torch.Tensor:
        out = []
        with torch.inference_mode():
            for start in range(0, residuals.shape[0], ENCODE_CHUNK):
                acts = sae.encode(
                    residuals[start : start + ENCODE_CHUNK].to(device=device, dtype=torch.float32)
                )
                picked = acts[:, index].float()
                out.append((picked[:, 0] if weight is None else picked @ weight).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    return score


def linear_score(weights: list[float], bias: float) -> Score:
    """sigmoid(w·x + b) per position, in float32 on the residual's device."""
    w = torch.tensor(weights, dtype=torch.float32)

    def score(residuals: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            x = residuals.float()
            return torch.sigmoid(x @ w.to(x.device) + bias).cpu()

    return score


def point_of(layer: int, hook_point: str) -> int:
    """The engine's residual point of a layer's hook point: after block L (resid_post), after
    block L-1 (resid_pre)."""
    if hook_point == "resid_post":
        return layer
    return layer - 1 if layer > 0 else EMBEDDINGS


@dataclass(frozen=True)
class Scorer:
    """A probe made runnable on the loaded model: where it reads, its score, and its threshold."""

    name: str
    point: int
    score: Score
    threshold: float


# a probe never scores position 0: the attention sink (see lab/discovery/reads.py), as trained
SKIPPED = 1


def watch_of(probe: Scorer) -> Watch:
    """A probe as the engine's report Watch: scored at every position a row feeds but the first,
    acting on nothing."""
    return Watch(probe.name, probe.point, probe.score, probe.threshold, "report", skip=SKIPPED)


@dataclass(frozen=True)
class ModelShape:
    """What a linear probe must fit: the served model's name, residual width and depth."""

    name: str
    hidden_size: int
    layers: int


# The calibration's quantile grids `[d_sae, 101]` of an SAE on the loaded model (None: not
# calibrated).
Grids = Callable[[str], "np.ndarray | None"]


def scorer(
    name: str,
    detector: dict,
    attached: dict[str, Attached],
    grids: Grids,
    model: ModelShape,
    param: str,
) -> Scorer:
    """A valid detector bound to what is loaded: its SAE attached (or its layer inside the model),
    its features within the SAE's width, its percentile calibrated; a 400 naming `param`
    otherwise."""
    if detector["type"] == "linear":
        return _linear_scorer(name, detector, model, param)
    target = attached.get(detector["sae_id"])
    if target is None:
        names = ", ".join(sorted(attached)) or "none"
        raise InvalidRequest(
            f"{param}: SAE {detector['sae_id']} is not attached (attached: {names}); attach it "
            f"first (POST /api/saes/{detector['sae_id']}/attach)",
            param=f"{param}.sae_id",
            code="sae_not_attached",
        )
    if detector["type"] == "feature":
        index = check_feature(target.info, detector["index"], param=f"{param}.index")
        threshold = detector.get("threshold")
        if threshold is None:
            threshold = _percentile_value(
                target, index, detector["percentile"], grids, model.name, param
            )
        return Scorer(
            name, target.read_point, feature_score(target, [index], None), float(threshold)
        )
    indices = [
        check_feature(target.info, f["index"], param=f"{param}.features[{i}].index")
        for i, f in enumerate(detector["features"])
    ]
    weights = [float(f["weight"]) for f in detector["features"]]
    return Scorer(
        name,
        target.read_point,
        feature_score(target, indices, weights),
        float(detector["threshold"]),
    )


def _percentile_value(
    target: Attached, index: int, percent: int, grids: Grids, model: str, param: str
) -> float:
    """The feature's activation at `percent` of its firing activations in the calibration on
    `model`."""
    sae_id = target.info.id
    grid = grids(sae_id)
    if grid is None:
        raise InvalidRequest(
            f"{param}: a percentile needs {sae_id} calibrated on {model!r}, and it is not; "
            f"calibrate it (POST /api/saes/{sae_id}/calibrate) or give a threshold",
            param=f"{param}.percentile",
            code="not_calibrated",
        )
    value = float(grid[index, percent])
    if math.isnan(value):
        raise InvalidRequest(
            f"{param}: feature {index} never fired in the calibration of {sae_id} on {model!r}, "
            "so it has no percentile; give a threshold",
            param=f"{param}.percentile",
            code="not_calibrated",
        )
    return value


def _linear_scorer(name: str, detector: dict, model: ModelShape, param: str) -> Scorer:
    training = detector.get("training")
    if training is not None and training["model"] != model.name:
        raise InvalidRequest(
            f"{param}: this linear probe was trained on {training['model']!r}, not the loaded "
            f"{model.name!r}; a residual direction of one model means nothing in another",
            param=f"{param}.training.model",
            code="probe_model_mismatch",
        )
    if len(detector["weights"]) != model.hidden_size:
        raise InvalidRequest(
            f"{param}: the probe has {len(detector['weights'])} weights, but {model.name} has "
            f"residual width {model.hidden_size}",
            param=f"{param}.weights",
        )
    if detector["layer"] >= model.layers:
        raise InvalidRequest(
            f"{param}: layer {detector['layer']} is past the last layer of {model.name} "
            f"({model.layers} layers: 0..{model.layers - 1})",
            param=f"{param}.layer",
        )
    point = point_of(detector["layer"], detector["hook_point"])
    return Scorer(
        name,
        point,
        linear_score(detector["weights"], float(detector["bias"])),
        float(detector["threshold"]),
    )


# ---- verdicts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """Where a probe fired over a row's positions, as the engine reports it (ProbeVerdict's
    figures)."""

    fired: bool
    first_position: int | None
    peak: float | None
    peak_position: int | None
    positions: tuple[int, ...]  # the first KEPT_POSITIONS where it fired
    token_ids: tuple[int, ...]  # the token at each of them


def verdict_of(
    scores: torch.Tensor, threshold: float, positions: tuple[int, ...], token_ids: tuple[int, ...]
) -> Verdict:
    """The verdict of per-position scores: fired where score >= threshold; the peak is the largest
    score (its first position on a tie)."""
    if scores.numel() == 0:
        return Verdict(False, None, None, None, (), ())
    values = scores.tolist()
    hits = [i for i, value in enumerate(values) if value >= threshold]
    peak = max(range(len(values)), key=lambda i: (values[i], -i))
    kept = hits[:KEPT_POSITIONS]
    return Verdict(
        fired=bool(hits),
        first_position=positions[hits[0]] if hits else None,
        peak=float(values[peak]),
        peak_position=positions[peak],
        positions=tuple(positions[i] for i in kept),
        token_ids=tuple(token_ids[i] for i in kept),
    )


def served_scores(
    probe: Scorer, residuals: torch.Tensor, prompt_length: int | None = None
) -> torch.Tensor:
    """A probe's score at each position of residuals `[n, d]`; with `prompt_length`, scored in
    the shapes the engine's passes fed them (the prompt at once, then one position per step), so
    the same bits as a watch during generation."""
    if prompt_length is None:
        return probe.score(residuals)
    parts = [residuals[:prompt_length]] + [
        residuals[p : p + 1] for p in range(prompt_length, residuals.shape[0])
    ]
    return torch.cat([probe.score(part) for part in parts if part.shape[0]])


def offline_verdict(
    probe: Scorer,
    residuals: torch.Tensor,
    positions: tuple[int, ...],
    token_ids: tuple[int, ...],
    prompt_length: int | None = None,
) -> Verdict:
    """A probe's verdict over residuals captured at its point (before that point's edits), one row's
    positions in order from 0 (position 0 is not scored, as a watch leaves it out). With
    `prompt_length`, scored as the engine's forward passes fed them (the prompt at once, then one
    position per step): the same shapes, so the same bits."""
    scores = served_scores(probe, residuals, prompt_length)
    kept = [i for i, position in enumerate(positions) if position >= SKIPPED]
    return verdict_of(
        scores[kept],
        probe.threshold,
        tuple(positions[i] for i in kept),
        tuple(token_ids[i] for i in kept),
    )


def verdict_fields(verdict: ProbeVerdict) -> dict:
    """An engine ProbeVerdict's figures as JSON (token ids only: their text is the caller's to
    decode)."""
    return {
        "name": verdict.name,
        "action": verdict.action,
        "fired": verdict.fired,
        "first_position": verdict.first_position,
        "peak": verdict.peak,
        "peak_position": verdict.peak_position,
        "positions": list(verdict.positions),
        "token_ids": list(verdict.token_ids),
        "acted_at": verdict.acted_at,
    }
