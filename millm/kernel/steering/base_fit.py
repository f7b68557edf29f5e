"""Whether and how a base (a cluster or a circuit) fits now: the dial's limits, the refusal of a
base that does not fit, and a circuit's layers bound to the attached SAEs, its mode (full, slice
fallback or none) and its rung."""

from __future__ import annotations

from dataclasses import dataclass

from millm.formats.mistudio import (
    circuit_members,
    rung,
)
from millm.interp.binding import (
    BOUND,
    LayerBinding,
    circuit_bindings,
    circuit_mode,
)
from millm.interp.steering import Attached, InvalidFeatureIndex
from millm.kernel.steering.live import Steering


@dataclass(frozen=True)
class CircuitStatus:
    """Whether and how a circuit steers now (GET /api/circuits/active)."""

    mode: str  # full | slice_fallback | none
    bindings: dict[int, LayerBinding]
    rung: int


def circuit_status(document: dict, steering: Steering) -> CircuitStatus:
    """Bind a circuit's layers to the attached SAEs and say how it would be served."""
    return attached_circuit_status(document, steering.attached)


def attached_circuit_status(document: dict, attached: dict[str, Attached]) -> CircuitStatus:
    """Bind a circuit's layers to these attached SAEs and say how it would be served."""
    bindings = circuit_bindings(document, attached)
    return CircuitStatus(
        circuit_mode(bindings, circuit_members(document)), bindings, rung(document)
    )


def bound_layers(status: CircuitStatus) -> list[int]:
    """The layers of a circuit that bind now."""
    return [layer for layer, binding in status.bindings.items() if binding.status in BOUND]


class BaseUnfit(InvalidFeatureIndex):
    """400 invalid_feature_index: the active profile, cluster or circuit no longer fits the attached
    SAEs (one detached or replaced, an index past the width), naming the base and the entry."""

    def __init__(self, kind: str, name: str, problem: str):
        super().__init__(
            f"the active {kind} {name!r} no longer fits the attached SAEs: {problem}. Requests "
            "are refused rather than served unsteered; attach the SAEs it was made for, or "
            f"deactivate it (POST /api/{kind}s/deactivate)",
            param="steering",
        )
        self.problem = problem


@dataclass(frozen=True)
class DialLimits:
    """The configured envelope: CLUSTER_INTENSITY_MIN, CIRCUIT_INTENSITY_MIN and the maximum."""

    cluster_min: float = 0.5
    circuit_min: float = 0.0
    maximum: float = 2.0
