"""Concurrent circuits: the layers a circuit claims and the refusal when they are held.

Steering on a layer is one sum into one residual, so the unit of contention is the layer: a
circuit claims the layers its serving members reach (a slice_fallback circuit, the ones it
serves), with the features it writes there. A circuit is activated only when its claim set is
disjoint from every live claim, or when `allow_layer_overlap` composes it onto the contended
layers (their claim is then marked composed, and the effect there is a sum). The same (layer,
feature) in two circuits is always refused: the sum on one feature would be neither's. Claims are
rows in the store, one live exclusive claim per layer held by a unique index, so concurrent
writers and other replicas are refused by the database itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.errors import Conflict
from millm.formats.mistudio import circuit_members
from millm.interp.steering import Attached
from millm.kernel.steering.base_fit import attached_circuit_status, bound_layers

# What one test measured of two circuits summed on layers: the original miLLM's numbers, quoted
# in every refusal so an operator knows what overriding risks.
MEASURED_HAZARD = {
    "source": "GPU close-out 2026-07-20, LFM2.5-1.2B-Instruct",
    "one_layer_at_strength_5": "coherent, indistinguishable from baseline",
    "two_layers_at_strength_5": "degenerate output (repeated tokens)",
    "note": "one model, one fixture — indicative, not exhaustive",
}


@dataclass(frozen=True)
class Claim:
    """What a circuit would claim now: layer -> the features it writes there, and its mode."""

    layers: dict[int, list[int]]
    mode: str  # full | slice_fallback | none


def claim_of(document: dict, attached: dict[str, Attached]) -> Claim:
    """The layers a circuit's serving members reach on the attached SAEs, with their features."""
    status = attached_circuit_status(document, attached)
    served = set(bound_layers(status))
    layers: dict[int, list[int]] = {}
    for member in circuit_members(document):
        if member.layer in served:
            layers.setdefault(member.layer, []).append(member.feature_idx)
    return Claim({layer: sorted(set(f)) for layer, f in layers.items()}, status.mode)


class CircuitLayerContention(Conflict):
    """409 circuit_layer_contention: a layer (or a feature on it) is held by an active circuit;
    `details` says which, by whom, and whether allow_layer_overlap may compose it."""

    def __init__(self, message: str, details: dict):
        super().__init__(message, param="allow_layer_overlap", code="circuit_layer_contention")
        self.details = details

    def to_dict(self) -> dict:
        """OpenAI's four fields plus `details`."""
        return {**super().to_dict(), "details": self.details}


def composed_layers(
    requested: dict,
    claim: Claim,
    live: list[dict],
    names: dict[str, str],
    modes: dict[str, str],
    allow_overlap: bool,
) -> set[int]:
    """The layers `requested` ({id, name}) would compose onto; a CircuitLayerContention when it
    may not be activated: a contended layer without the override, a feature another circuit
    writes on the same layer (never overridable), or a second slice_fallback circuit."""
    held: dict[int, list[dict]] = {}
    for row in live:
        held.setdefault(row["layer"], []).append(row)
    contended = sorted(set(claim.layers) & set(held))
    colliding = [
        {"layer": layer, "feature_idx": feature, "incumbent": holder["circuit_id"]}
        for layer in contended
        for holder in held[layer]
        for feature in claim.layers[layer]
        if feature in holder["steering_keys"]
    ]
    incumbents = sorted({row["circuit_id"] for row in live})
    slice_first = claim.mode == "slice_fallback" and "slice_fallback" in modes.values()
    if not contended and not slice_first:
        return set()
    first = held[contended[0]][0]["circuit_id"] if contended else incumbents[0]
    details: dict = {
        "contended_layers": contended,
        "incumbent": {"id": first, "name": names.get(first)},
        "requested": requested,
        "colliding_keys": colliding,
        "all_incumbents": [{"id": i, "name": names.get(i)} for i in incumbents],
        "overridable": not colliding and not slice_first,
        "measured_hazard": MEASURED_HAZARD,
    }
    if slice_first:
        details["reason"] = "slice_fallback_is_single_active"
    if details["overridable"]:
        details["override_param"] = "allow_layer_overlap"
        details["rung_header_suppressed_if_overridden"] = True
        if allow_overlap:
            return set(contended)
    raise CircuitLayerContention(_said(requested, details), details)


def _said(requested: dict, details: dict) -> str:
    incumbent = details["incumbent"]
    hazard = MEASURED_HAZARD["two_layers_at_strength_5"]
    if details.get("reason") == "slice_fallback_is_single_active":
        return (
            f"circuit {requested['name']!r} would serve as slice_fallback, and "
            f"{incumbent['name']!r} already does: only one slice_fallback circuit is active at a "
            "time (not overridable)"
        )
    layers = ", ".join(str(layer) for layer in details["contended_layers"])
    if details["colliding_keys"]:
        keys = ", ".join(f"{k['feature_idx']}@{k['layer']}" for k in details["colliding_keys"])
        return (
            f"circuit {requested['name']!r} writes features {keys} that active circuit "
            f"{incumbent['name']!r} writes too: the same feature on the same layer is never "
            "shared (not overridable)"
        )
    return (
        f"circuit {requested['name']!r} needs layer(s) {layers}, held by active circuit "
        f"{incumbent['name']!r}: steering there would be the sum of both (measured: {hazard} at "
        "strength 5 on two layers). Send allow_layer_overlap=true to compose it anyway, or "
        "deactivate the incumbent"
    )
