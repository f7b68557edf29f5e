"""Steering math: feature operators on attached SAEs -> the residual edit a request carries.

add: delta_L = Σ_i s_i · W_dec[i], summed over every attached SAE hooked at the same point, added
at every position. Strengths are limited to ±200; the sum is computed in float32 and only then
cast to the model's dtype by the engine. clamp, ablate and cap are operations on the residual
(operators.py), applied after the point's additions: per SAE, in id order, its caps and then its
clamps and ablations (held together).

A transcoder (hook point mlp) writes where its block adds the MLP's output, the residual after
the block, and is read at the block's MLP input (`read_point`); a cross-layer transcoder's block
writes after every block from its own on (`reach`), so its adds and holds land at each of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from millm.engine.residual import EMBEDDINGS, AnyOperation, ResidualEdit, mlp_input
from millm.errors import InvalidFeatureIndex, InvalidRequest
from millm.interp.intensity import STRENGTH_LIMIT, clamp_strength
from millm.interp.operators import Held, feature_cap, hold, transcoder_hold
from millm.interp.sae import SAE
from millm.interp.sae_files import SAEInfo

Op = Literal["add", "clamp", "ablate", "cap"]
OPS: tuple[Op, ...] = ("add", "clamp", "ablate", "cap")


def residual_point(layer: int, hook_point: str) -> int:
    """The engine's residual point where a hook point at a layer writes: after block L for
    resid_post and for mlp (a transcoder's output joins the residual after its block), after block
    L-1 for resid_pre (before block 0, EMBEDDINGS, for resid_pre of layer 0)."""
    if hook_point in ("resid_post", "mlp"):
        return layer
    return layer - 1 if layer > 0 else EMBEDDINGS


@dataclass(frozen=True)
class Attached:
    """An SAE attached to the loaded model: its weights and where it reads/steers."""

    info: SAEInfo
    sae: SAE
    layer: int

    @property
    def point(self) -> int:
        """Where its steering writes: the engine's residual point of its hook point
        (residual_point)."""
        return residual_point(self.layer, self.info.hook_point)

    @property
    def transcoder(self) -> bool:
        """Whether it reads its block's MLP input and writes the MLP's output (hook point mlp)."""
        return self.info.hook_point == "mlp"

    @property
    def reach(self) -> int:
        """How many blocks its features write into, from its own on (a cross-layer transcoder's
        block: every later one; anything else: 1)."""
        return self.sae.reach

    def directions(self, strengths: dict[int, float]) -> list[tuple[int, torch.Tensor]]:
        """(point, Σ s_i · its write there) for each point its features write into."""
        if self.reach == 1:
            return [(self.point, self.sae.direction(strengths))]
        device = self.sae.W_dec.device
        rows = self.sae.writes(torch.tensor(list(strengths), dtype=torch.long, device=device))
        values = torch.tensor(list(strengths.values()), dtype=rows.dtype, device=device)
        return [(self.point + k, values @ rows[:, k]) for k in range(self.reach)]

    @property
    def read_point(self) -> int:
        """Where its features are read: its block's MLP input for a transcoder, else `point`."""
        return mlp_input(self.layer) if self.transcoder else self.point


@dataclass(frozen=True)
class FeatureOp:
    """What steering does to one feature: add `strength`·W_dec[f], or clamp / cap at `value`, or
    ablate."""

    op: Op = "add"
    strength: float = 0.0  # add only
    value: float | None = None  # clamp and cap only

    @classmethod
    def of(cls, feature: dict) -> FeatureOp:
        """From a (valid) document's feature: {"index", "op"?, "strength"?, "value"?}."""
        return cls(
            feature.get("op", "add"), float(feature.get("strength") or 0.0), feature.get("value")
        )

    def to_dict(self) -> dict:
        """As documents and the API write it: op with its strength or value."""
        if self.op == "add":
            return {"op": "add", "strength": self.strength}
        return {"op": self.op} if self.op == "ablate" else {"op": self.op, "value": self.value}

    def scaled(self, scale: float) -> FeatureOp:
        """Through the dial: an add's strength times `scale` (clamped to ±200); other ops unchanged,
        since their value is a level to hold, not a push to make stronger."""
        return FeatureOp("add", clamp_strength(self.strength * scale)) if self.op == "add" else self


def pick_attached(
    attached: dict[str, Attached], sae_id: str | None, param: str, prefix: str = ""
) -> Attached:
    """The attached SAE named, or the only one attached when none is named; 400 naming `param`
    otherwise (`sae_not_attached` when it is not attached), the message led by `prefix`."""
    names = ", ".join(sorted(attached)) or "none"
    if not attached:
        raise InvalidRequest(
            f"{prefix}no SAE is attached to the model; attach one first (POST "
            f"/api/saes/{{id}}/attach)",
            param=param,
            code="sae_not_attached",
        )
    if sae_id is None:
        if len(attached) > 1:
            raise InvalidRequest(
                f"{prefix}several SAEs are attached ({names}); name one with sae_id", param=param
            )
        return next(iter(attached.values()))
    if sae_id not in attached:
        raise InvalidRequest(
            f"{prefix}SAE {sae_id!r} is not attached (attached: {names})",
            param=param,
            code="sae_not_attached",
        )
    return attached[sae_id]


def check_strength(value: float, param: str = "strength") -> float:
    """A strength within ±200, or a 400 naming the limit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidRequest(f"{param} must be a number, got {value!r}", param=param)
    if abs(value) > STRENGTH_LIMIT:
        raise InvalidRequest(
            f"{param} {value} is outside the steering range ±{STRENGTH_LIMIT:g}", param=param
        )
    return float(value)


def check_feature(info: SAEInfo, index: int, param: str = "index") -> int:
    """A feature index within the SAE's width, or 400 invalid_feature_index with the figures."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidRequest(f"{param} must be a non-negative integer, got {index!r}", param=param)
    if index >= info.d_sae:
        raise InvalidFeatureIndex(
            f"feature {index} is past the width of {info.id} ({info.d_sae} features: "
            f"0..{info.d_sae - 1})",
            param=param,
        )
    return index


def check_value(op: str, value: float | None, param: str = "value") -> float | None:
    """The value an op needs (clamp and cap: a finite number >= 0; add and ablate: none), or a
    400 naming `param`."""
    if op in ("add", "ablate"):
        if value is not None:
            raise InvalidRequest(
                f"{param} is for op clamp and cap only ({op} takes "
                f"{'strength' if op == 'add' else 'neither'})",
                param=param,
            )
        return None
    if value is None:
        raise InvalidRequest(
            f"op {op} needs {param} (the "
            f"{'target activation' if op == 'clamp' else 'largest component'}, >= 0)",
            param=param,
        )
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value >= 0
        or value == float("inf")
    ):
        raise InvalidRequest(f"{param} must be a finite number >= 0, got {value!r}", param=param)
    return float(value)


def feature_op(op: str, strength: float | None, value: float | None, prefix: str = "") -> FeatureOp:
    """A checked operator from its parts: add needs `strength` (±200), clamp and cap need `value`
    (>= 0), ablate takes neither; a 400 naming the field (`prefix` leads its name) otherwise."""
    if op not in OPS:
        raise InvalidRequest(
            f"{prefix}op must be one of {', '.join(OPS)}, got {op!r}", param=f"{prefix}op"
        )
    if op != "add" and strength is not None:
        raise InvalidRequest(
            f"{prefix}strength is for op add only (op {op} takes "
            f"{'value' if op != 'ablate' else 'neither'})",
            param=f"{prefix}strength",
        )
    checked = check_value(op, value, param=f"{prefix}value")
    if op == "add":
        if strength is None:
            raise InvalidRequest(
                f"op add needs {prefix}strength (within ±{STRENGTH_LIMIT:g})",
                param=f"{prefix}strength",
            )
        return FeatureOp("add", check_strength(strength, param=f"{prefix}strength"))
    return FeatureOp(op, 0.0, checked)


def steering_edit(
    strengths: dict[str, dict[int, float]], attached: dict[str, Attached]
) -> ResidualEdit | None:
    """The residual additions for these strengths through the attached SAEs (None: nothing to add).

    Strengths of SAEs that are not attached are skipped: they cannot steer anything.
    """
    additions = []
    for sae_id, features in sorted(strengths.items()):
        target = attached.get(sae_id)
        active = {i: clamp_strength(s) for i, s in features.items() if s != 0}
        if target is None or not active:
            continue
        additions.extend(target.directions(active))
    return ResidualEdit(tuple(additions)) if additions else None


def feature_edit(
    features: dict[str, dict[int, FeatureOp]],
    attached: dict[str, Attached],
    param: str = "steering",
) -> ResidualEdit | None:
    """The edit of these feature operators through the attached SAEs (None: nothing to do).

    Adds are `steering_edit`'s (so add-only steering is exactly what it always was); the other
    ops become operations: per SAE in id order, its caps (by index) and then one hold of its
    clamps and ablations. SAEs that are not attached are skipped, as by steering_edit; an op
    that cannot be honoured on its SAE is a 400 naming `param` (operators.py says when).
    """
    adds = {
        sae_id: {i: f.strength for i, f in ops.items() if f.op == "add"}
        for sae_id, ops in features.items()
    }
    added = steering_edit(adds, attached)
    operations: list[tuple[int, AnyOperation]] = []
    for sae_id, ops in sorted(features.items()):
        target = attached.get(sae_id)
        if target is None:
            continue
        for index, f in sorted(ops.items()):
            if f.op == "cap" and target.reach > 1:
                raise InvalidRequest(
                    f"feature {index} of {sae_id} (a cross-layer transcoder) writes into "
                    f"{target.reach} blocks: cap limits one direction at one point; use add, "
                    "clamp or ablate",
                    param=param,
                    code="operator_not_applicable",
                )
            if f.op == "cap":
                operations.append(
                    (
                        target.point,
                        feature_cap(target.sae, sae_id, index, float(f.value or 0.0), param),
                    )
                )
        held = [
            Held(index, float(f.value or 0.0))
            for index, f in sorted(ops.items())
            if f.op in ("clamp", "ablate")
        ]
        if held and target.transcoder:
            for k in range(target.reach):  # a cross-layer feature's every write
                operation = transcoder_hold(target.sae, sae_id, held, target.read_point, k)
                operations.append((target.point + k, operation))
        elif held:
            operations.append((target.point, hold(target.sae, sae_id, held, param)))
    if not operations:
        return added
    return ResidualEdit(added.additions if added is not None else (), tuple(operations))
