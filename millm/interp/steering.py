"""Steering math: feature strengths on attached SAEs -> the residual additions a request carries.

delta_L = Σ_i s_i · W_dec[i], summed over every attached SAE hooked at the same point, added
at every position. Strengths are limited to ±200; the sum is computed in float32 and only then
cast to the model's dtype by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.residual import EMBEDDINGS, ResidualEdit
from millm.errors import InvalidFeatureIndex, InvalidRequest
from millm.interp.formats import SAEInfo
from millm.interp.intensity import STRENGTH_LIMIT, clamp_strength
from millm.interp.sae import SAE


def residual_point(layer: int, hook_point: str) -> int:
    """The engine's residual point of a hook point at a layer: after block L for resid_post, after
    block L-1 for resid_pre (before block 0, EMBEDDINGS, for resid_pre of layer 0)."""
    return layer if hook_point == "resid_post" else (layer - 1 if layer > 0 else EMBEDDINGS)


@dataclass(frozen=True)
class Attached:
    """An SAE attached to the loaded model: its weights and where it reads/steers."""

    info: SAEInfo
    sae: SAE
    layer: int

    @property
    def point(self) -> int:
        """The engine's residual point of the SAE's hook point at its layer (see residual_point)."""
        return residual_point(self.layer, self.info.hook_point)


def pick_attached(attached: dict[str, Attached], sae_id: str | None, param: str, prefix: str = "") -> Attached:
    """The attached SAE named, or the only one attached when none is named; 400 naming `param` otherwise
    (`sae_not_attached` when it is not attached), the message led by `prefix`."""
    names = ", ".join(sorted(attached)) or "none"
    if not attached:
        raise InvalidRequest(f"{prefix}no SAE is attached to the model; attach one first (POST /api/saes/{{id}}/attach)", param=param, code="sae_not_attached")
    if sae_id is None:
        if len(attached) > 1:
            raise InvalidRequest(f"{prefix}several SAEs are attached ({names}); name one with sae_id", param=param)
        return next(iter(attached.values()))
    if sae_id not in attached:
        raise InvalidRequest(f"{prefix}SAE {sae_id!r} is not attached (attached: {names})", param=param, code="sae_not_attached")
    return attached[sae_id]


def check_strength(value: float, param: str = "strength") -> float:
    """A strength within ±200, or a 400 naming the limit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidRequest(f"{param} must be a number, got {value!r}", param=param)
    if abs(value) > STRENGTH_LIMIT:
        raise InvalidRequest(f"{param} {value} is outside the steering range ±{STRENGTH_LIMIT:g}", param=param)
    return float(value)


def check_feature(info: SAEInfo, index: int, param: str = "index") -> int:
    """A feature index within the SAE's width, or 400 invalid_feature_index with the figures."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidRequest(f"{param} must be a non-negative integer, got {index!r}", param=param)
    if index >= info.d_sae:
        raise InvalidFeatureIndex(
            f"feature {index} is past the width of {info.id} ({info.d_sae} features: 0..{info.d_sae - 1})", param=param
        )
    return index


def steering_edit(strengths: dict[str, dict[int, float]], attached: dict[str, Attached]) -> ResidualEdit | None:
    """The residual additions for these strengths through the attached SAEs (None: nothing to add).

    Strengths of SAEs that are not attached are skipped: they cannot steer anything.
    """
    additions = []
    for sae_id, features in sorted(strengths.items()):
        target = attached.get(sae_id)
        active = {i: clamp_strength(s) for i, s in features.items() if s != 0}
        if target is None or not active:
            continue
        additions.append((target.point, target.sae.direction(active)))
    return ResidualEdit(tuple(additions)) if additions else None
