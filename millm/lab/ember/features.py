"""Ember's features as millm's: a feature's id, the SAE Ember's routes speak of, and Ember's units.

**Ids.** An Ember feature is a UUID; a millm feature is an SAE and an index, and an SAE's id is
`sae_` and the first 12 hex digits of its weights file's SHA-256. The UUID holds both: those 12
digits, then version 8 (RFC 9562's custom UUID), then the index after the variant bits, so
`26274363-0f92-8000-8000-00000000057b` is feature 1403 of `sae_262743630f92`. The same file gives
the same ids on every server and after every restart, and an id is read back without a table.

**The SAE.** Ember served one SAE per model; millm may attach several. Routes that name features
by id find their SAE in the id; routes that name none (search, lookup by index) use the one SAE
attached, and refuse when there are several, naming them.

**Units.** Ember's numbers (a nudge, a pin, a condition's level, an activation read back) are
fractions of a feature's largest activation in the SAE's calibration on the served model, as
Ember's features carried `max_activation_strength: 1`. A nudge of 0.5 on the demo's pirate feature
(calibrated max 45.06) adds 22.5 × W_dec. A feature that never fired in the calibration takes the
SAE's median feature maximum, so it still has a scale. An SAE not calibrated on the served model
has no units: Ember's routes that need them refuse it, saying how to calibrate.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from millm.errors import InvalidRequest
from millm.interp.steering import Attached
from millm.lab.ember.parts import EmberParts
from millm.lab.ember.protocol import FeatureOut

SAE_PREFIX = "sae_"
_SAE_DIGITS = 12
_VARIANT_BIT = 1 << 63  # RFC 9562's variant (binary 10) at the head of the last 64 bits


def feature_id(sae_id: str, index: int) -> str:
    """The Ember id of feature `index` of `sae_id` (a UUID's text)."""
    digits = sae_id.removeprefix(SAE_PREFIX)
    return str(uuid.UUID(f"{digits}8000{_VARIANT_BIT | index:016x}"))


def feature_of(text: str, param: str) -> tuple[str, int]:
    """The (SAE id, index) an Ember feature id names, or a 400 naming `param`."""
    try:
        value = uuid.UUID(str(text))
    except ValueError:
        value = None
    if value is None or value.version != 8 or value.hex[12:16] != "8000":
        raise InvalidRequest(
            f"{text!r} is not a feature id of this server (ids come from its feature routes: "
            "search, lookup, inspect)",
            param=param,
            code="invalid_feature_id",
        )
    return SAE_PREFIX + value.hex[:_SAE_DIGITS], int(value.hex[16:], 16) & ~_VARIANT_BIT


def attached_sae(state: EmberParts, sae_id: str | None, param: str) -> Attached:
    """The attached SAE a route speaks of: `sae_id` when an id named it, else the one attached."""
    attached = state.steering.attached
    if sae_id is not None:
        found = attached.get(sae_id)
        if found is None:
            state.saes.get(sae_id)  # 404 sae_not_found when it is not even registered
            raise InvalidRequest(
                f"{sae_id} is registered but not attached; attach it (POST /api/saes/{sae_id}/"
                "attach) to use its features",
                param=param,
                code="sae_not_attached",
            )
        return found
    if len(attached) == 1:
        return next(iter(attached.values()))
    if not attached:
        raise InvalidRequest(
            "no SAE is attached, so there are no features; attach one (POST /api/saes/{id}/attach)",
            param="model",
            code="sae_not_attached",
        )
    found_ = ", ".join(f"{key} at layer {a.layer}" for key, a in sorted(attached.items()))
    raise InvalidRequest(
        f"{len(attached)} SAEs are attached ({found_}); Ember's routes speak of one SAE: detach "
        "the others, or use millm's own routes, which name the SAE",
        param="model",
        code="sae_not_attached",
    )


def check_index(sae: Attached, index: int, param: str) -> int:
    """`index` within the SAE's width, or a 400 naming `param`."""
    if not 0 <= index < sae.info.d_sae:
        raise InvalidRequest(
            f"feature {index} is past the width of {sae.info.id} ({sae.info.d_sae} features: "
            f"0..{sae.info.d_sae - 1})",
            param=param,
            code="invalid_feature_index",
        )
    return index


@dataclass(frozen=True)
class Units:
    """One SAE's Ember units on the served model: each feature's scale (its calibrated max, or
    the SAE's median max where it never fired)."""

    sae_id: str
    scale: np.ndarray  # [d_sae] float64, every entry > 0
    median: np.ndarray  # [d_sae] each feature's median firing activation (NaN: never fired)

    def to_millm(self, index: int, value: float) -> float:
        """An Ember value of feature `index` as millm's activation or strength."""
        return float(value * self.scale[index])

    def to_ember(self, index: int, value: float) -> float:
        """A millm activation or strength of feature `index` in Ember's units."""
        return float(value / self.scale[index])

    def typical(self, index: int) -> float | None:
        """Feature `index`'s median firing level in Ember's units (None: it never fired)."""
        median = float(self.median[index])
        return self.to_ember(index, median) if np.isfinite(median) and median > 0 else None


def units_of(state: EmberParts, sae: Attached, param: str) -> Units:
    """The SAE's units on the served model, or a 400 saying how to calibrate it."""
    model = state.switch.lm.name if state.switch.lm is not None else state.switch.expected_name
    table = state.calibrations.table(sae.info.id, model) if model is not None else None
    if table is None:
        raise InvalidRequest(
            f"{sae.info.id} is not calibrated on {model}: Ember's values are fractions of a "
            "feature's largest activation in a calibration; calibrate first (POST /api/saes/"
            f"{sae.info.id}/calibrate)",
            param=param,
            code="sae_not_calibrated",
        )
    peaks = table.grids[:, -1].astype(np.float64)
    fired = np.isfinite(peaks) & (peaks > 0)
    if not fired.any():
        raise InvalidRequest(
            f"no feature of {sae.info.id} fired in its calibration on {model}, so it has no "
            "scale; calibrate it on more text",
            param=param,
            code="sae_not_calibrated",
        )
    scale = np.where(fired, peaks, float(np.median(peaks[fired])))
    return Units(sae.info.id, scale, table.grids[:, 50].astype(np.float64))


def served_model(state: EmberParts, model: str) -> None:
    """400 when `model` names no model, or no steered variant of one, that this server serves
    now."""
    served = state.switch.lm.name if state.switch.lm is not None else None
    if state.variants.named(model).base != served:
        raise InvalidRequest(
            f"model {model!r} is not served here (serving {served!r}); name the served model or "
            "one of its steered variants",
            param="model",
            code="model_not_found",
        )


def labels_of(state: EmberParts, sae_id: str) -> dict[int, str]:
    """The SAE's labels by index (the features that have one; blocking: the store)."""
    return {
        index: entry["label"]
        for index, entry in state.labels.entries(sae_id).items()
        if entry.get("label")
    }


def feature_out(
    sae_id: str, index: int, labels: dict[int, str], relevance: float | None = None
) -> FeatureOut:
    """A feature as Ember's answers give it (an unlabelled one with an empty label)."""
    return FeatureOut(
        id=feature_id(sae_id, index),
        label=labels.get(index, ""),
        index_in_sae=index,
        relevance=relevance,
    )
