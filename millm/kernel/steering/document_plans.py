"""The plans of the original miLLM's documents, a cluster and a circuit, through the dial: their
members summed into one edit on the layers they bind to, and what it applies per SAE (a cluster's,
for X-miLLM-Steering; a circuit is named whole)."""

from __future__ import annotations

from dataclasses import replace

from millm.engine.residual import combined
from millm.formats.mistudio import (
    Member,
    authored_intensity,
    circuit_members,
    cluster_members,
    declared_range,
)
from millm.interp.binding import cluster_binding, members_edit, members_strengths
from millm.interp.intensity import Dial, circuit_lambda, cluster_lambda
from millm.interp.steering import InvalidFeatureIndex, steering_edit
from millm.interp.steering_hash import strength_sets
from millm.kernel.steering.base_fit import DialLimits, attached_circuit_status, bound_layers
from millm.kernel.steering.plan import NO_STEERING, Plan, unsteered
from millm.kernel.steering.plan_cache import Snapshot


def cluster_plan(
    row: dict, document: dict, now: Snapshot, dial: Dial | None, limits: DialLimits
) -> Plan:
    """A cluster's plan: its members on the layer its SAE binds, at its stored intensity or the
    dial's (the cluster rule)."""
    binding = cluster_binding(document, now.attached)
    if dial is None:
        intensity = row["intensity"]
    else:
        intensity = cluster_lambda(
            dial, declared_range(document), limits.cluster_min, limits.maximum
        )
    members = [
        Member(binding.layer, m.feature_idx, m.strength, m.sign) for m in cluster_members(document)
    ]
    strengths = members_strengths(members, {binding.layer: binding}, now.attached, intensity)
    edit = steering_edit(strengths, now.attached)
    if edit is None:
        return unsteered(dial, intensity)
    return Plan(
        edit,
        "cluster",
        (("name", row["name"]), ("version", now.version)),
        intensity=intensity if dial else None,
        applied=strength_sets(strengths, now.attached),
        level=intensity,
    )


def circuit_plan(
    row: dict, document: dict, now: Snapshot, dial: Dial | None, limits: DialLimits
) -> Plan:
    """A circuit's plan: its members on every layer that binds (full), or on those that do
    (slice_fallback, the cluster rule); 400 when none does."""
    status = attached_circuit_status(document, now.attached)
    if status.mode == "none":
        details = "; ".join(f"layer {layer}: {b.detail}" for layer, b in status.bindings.items())
        raise InvalidFeatureIndex(
            f"none of its member layers binds to an attached SAE ({details})", param="steering"
        )
    declared = declared_range(document)
    if dial is None:  # its persistent dial, else what its document authored
        stored = row.get("intensity")
        intensity = stored if stored is not None else authored_intensity(document)
    elif status.mode == "full":
        intensity = circuit_lambda(dial, declared, limits.circuit_min, limits.maximum)
    else:
        intensity = cluster_lambda(dial, declared, limits.cluster_min, limits.maximum)
    edit = members_edit(circuit_members(document), status.bindings, now.attached, intensity)
    if edit is None:
        return unsteered(dial, intensity)
    params = (("name", row["name"]), ("mode", status.mode), ("version", now.version))
    return Plan(
        edit,
        "circuit",
        params,
        intensity=intensity if dial else None,
        rung=status.rung if status.mode == "full" else None,
        level=intensity,
        base_id=row["id"],
    )


def circuits_plan(
    bases: list[tuple[dict, dict]], now: Snapshot, dial: Dial | None, limits: DialLimits
) -> Plan:
    """The plan of the circuits active together ((row, document) each, in activation order): the
    sum of their edits, each part marked `composed` where it shares a layer with another. With
    several, the dial is not applied (there is no one λ to scale them by) and no rung is said."""
    if len(bases) == 1:
        return circuit_plan(*bases[0], now, dial, limits)
    layers = {
        row["id"]: set(bound_layers(attached_circuit_status(document, now.attached)))
        for row, document in bases
    }
    shared = {
        layer for row, _ in bases for layer in layers[row["id"]]
        if sum(layer in held for held in layers.values()) > 1
    }  # fmt: skip
    parts = []
    for row, document in bases:
        plan = circuit_plan(row, document, now, None, limits)
        if plan.kind == "circuit":
            parts.append(replace(plan, composed=bool(layers[row["id"]] & shared)))
    if not parts:
        return NO_STEERING
    edit = None
    for part in parts:
        edit = combined(edit, part.edit)
    names = ", ".join(str(dict(part.params)["name"]) for part in parts)
    return Plan(edit, "circuit", (("name", names), ("version", now.version)), parts=tuple(parts))
