"""What steered one SAE for a request, as applied, and its canonical hash: the original miLLM's
`X-miLLM-Steering` header carries it (`hash="sha256:…"`), so two servers, or a server and a
client, can tell whether they steered with the same values without sending them.

`sha256:` and the lowercase hex SHA-256 of UTF-8 lines, each ending in LF:

    millm.steering-set/v1
    sae=<sae id>
    <index>:<16 lowercase hex digits of the big-endian binary64 strength>   (one per feature)

over the applied strengths (clamped to ±200, as steering applies them), the features whose
strength is zero left out (−0.0 is zero), in ascending index. A set of adds alone hashes exactly
as the original's. millm's other operators have lines of their own, so a clamp never hashes as
an add of the same number: `<index>:clamp:<hex>`, `<index>:cap:<hex>` (the value held or
capped at) and `<index>:ablate`; a steering vector's set has `vector=<id>` for `sae=` and index 0.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from millm.interp.intensity import STRENGTH_LIMIT, clamp_strength
from millm.interp.steering import Attached, FeatureOp

HEADER = "millm.steering-set/v1"


def applied_set(features: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """(index, strength) as applied: each strength clamped, zeros dropped, by ascending index."""
    clamped = ((index, clamp_strength(strength)) for index, strength in features)
    return sorted((index, strength) for index, strength in clamped if strength != 0.0)


def steering_set_hash(sae_id: str, features: Iterable[tuple[int, float]]) -> str:
    """`sha256:<hex>` of the applied set of (index, add strength) on one SAE."""
    return _hash(f"sae={sae_id}", [(i, FeatureOp("add", s)) for i, s in applied_set(features)])


def _hex(value: float) -> str:
    return struct.pack(">d", value).hex()


def _line(index: int, op: FeatureOp) -> str:
    if op.op == "add":
        return f"{index}:{_hex(op.strength)}"
    if op.op == "ablate":
        return f"{index}:ablate"
    return f"{index}:{op.op}:{_hex(float(op.value or 0.0))}"


def _hash(target: str, ops: Iterable[tuple[int, FeatureOp]]) -> str:
    lines = [HEADER, target, *(_line(index, op) for index, op in ops)]
    text = "".join(line + "\n" for line in lines)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _changes(op: FeatureOp) -> bool:
    return op.op != "add" or op.strength != 0.0


@dataclass(frozen=True)
class AppliedSet:
    """What steered one SAE (or one steering vector) of a request, as the engine applies it: the
    ops by ascending index (add strengths scaled and clamped), the layer, the probe whose firing
    starts it (`when`), and how many strengths the ±200 limit clamped."""

    target: str  # an SAE id, or a steering vector's id
    layer: int
    ops: tuple[tuple[int, FeatureOp], ...]
    vector: bool = False
    when: str | None = None
    clamped: int = 0

    @property
    def features(self) -> int:
        """How many features it changes (adds of 0 left out)."""
        return sum(_changes(op) for _, op in self.ops)

    @property
    def hash(self) -> str:
        """The canonical `sha256:` hash of the set (the module docstring's lines)."""
        target = f"vector={self.target}" if self.vector else f"sae={self.target}"
        return _hash(target, ((i, op) for i, op in self.ops if _changes(op)))


def scaled_ops(ops: dict[int, FeatureOp], scale: float) -> tuple[dict[int, FeatureOp], int]:
    """The ops through the dial (FeatureOp.scaled) and how many add strengths the limit clamped."""
    clamped = sum(
        op.op == "add" and abs(op.strength * scale) > STRENGTH_LIMIT for op in ops.values()
    )
    return {index: op.scaled(scale) for index, op in ops.items()}, clamped


def applied_sets(
    features: dict[str, dict[int, FeatureOp]],
    attached: dict[str, Attached],
    when: str | None = None,
    clamped: dict[str, int] | None = None,
) -> tuple[AppliedSet, ...]:
    """One set per attached SAE that changes something (SAEs not attached steer nothing)."""
    sets = []
    for sae_id, ops in sorted(features.items()):
        target = attached.get(sae_id)
        ordered = tuple(sorted(ops.items()))
        if target is None or not any(_changes(op) for _, op in ordered):
            continue
        count = (clamped or {}).get(sae_id, 0)
        sets.append(AppliedSet(sae_id, target.layer, ordered, when=when, clamped=count))
    return tuple(sets)


def strength_sets(
    strengths: dict[str, dict[int, float]], attached: dict[str, Attached]
) -> tuple[AppliedSet, ...]:
    """Applied sets of summed add strengths (a cluster's members), each clamped to ±200."""
    clamped = {
        sae: sum(abs(s) > STRENGTH_LIMIT for s in features.values())
        for sae, features in strengths.items()
    }
    ops = {
        sae: {i: FeatureOp("add", clamp_strength(s)) for i, s in features.items()}
        for sae, features in strengths.items()
    }
    return applied_sets(ops, attached, clamped=clamped)
