"""Binding miStudio documents to the attached SAEs, and turning their members into residual edits.

A document names SAEs by miStudio id, layer, n_features and d_model, never by millm id, so a
layer binds to the SAE attached at that layer:

- bind:     an SAE is attached at the layer and its width and d_in match what the document says;
- warn:     an SAE is attached there but the document does not say n_features, so the width
            cannot be checked (it still binds);
- block:    the SAE attached there has another width (or d_in) than the document says;
- unbound:  no SAE is attached at the layer.

A circuit is served in full when every member layer binds (bind or warn), as a slice of its
bound layers under the cluster rule (`slice_fallback`) when only some do, and not at all when
none do.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.residual import ResidualEdit
from millm.errors import InvalidRequest
from millm.formats.mistudio import Member
from millm.interp.intensity import applied_strength
from millm.interp.steering import Attached, InvalidFeatureIndex, steering_edit

BOUND = ("bind", "warn")


@dataclass(frozen=True)
class LayerBinding:
    """How one layer of a document binds to the attached SAEs."""

    layer: int
    status: str  # bind | warn | block | unbound
    sae_id: str | None
    detail: str

    def to_dict(self) -> dict:
        """For responses."""
        return {
            "layer": self.layer,
            "status": self.status,
            "sae_id": self.sae_id,
            "detail": self.detail,
        }


def bind_layer(layer: int, ref: dict, attached: dict[str, Attached]) -> LayerBinding:
    """Bind a document's SAE reference at `layer` to an attached SAE."""
    here = [a for a in attached.values() if a.layer == layer]
    if not here:
        return LayerBinding(layer, "unbound", None, f"no SAE is attached at layer {layer}")
    n_features, d_model = ref.get("n_features"), ref.get("d_model")
    if d_model is not None:
        here = [a for a in here if a.info.d_in == d_model] or here
        if here[0].info.d_in != d_model:
            return LayerBinding(
                layer,
                "block",
                None,
                f"d_model {d_model} but the SAE at layer {layer} reads d_in={here[0].info.d_in}",
            )
    if n_features is None:
        chosen = here[0]
        return LayerBinding(
            layer,
            "warn",
            chosen.info.id,
            f"n_features not declared; bound to {chosen.info.id} ({chosen.info.d_sae} features) "
            "unchecked",
        )
    matching = [a for a in here if a.info.d_sae == n_features]
    if not matching:
        widths = ", ".join(f"{a.info.id}: {a.info.d_sae}" for a in here)
        return LayerBinding(
            layer,
            "block",
            None,
            f"n_features {n_features} but the SAE at layer {layer} has another width ({widths})",
        )
    return LayerBinding(
        layer,
        "bind",
        matching[0].info.id,
        f"bound to {matching[0].info.id} ({n_features} features)",
    )


def cluster_binding(document: dict, attached: dict[str, Attached]) -> LayerBinding:
    """Where a cluster's members steer; refuses (400 with the figures) anything but bind/warn."""
    ref = document.get("sae") or {}
    layer = ref.get("layer")
    if layer is None:
        if len(attached) == 1:
            only = next(iter(attached.values()))
            layer = only.layer
        else:
            raise InvalidRequest(
                f"cluster {document['name']!r} names no sae.layer and {len(attached)} SAEs are "
                "attached; cannot choose",
                code="cluster_not_applicable",
            )
    binding = bind_layer(layer, ref, attached)
    if binding.status not in BOUND or binding.sae_id is None:  # a bound layer always names its SAE
        raise InvalidRequest(
            f"cluster {document['name']!r} cannot steer here: {binding.detail}",
            code="cluster_not_applicable",
        )
    width = attached[binding.sae_id].info.d_sae
    for member in document["members"]:
        if member["feature_idx"] >= width:
            raise InvalidFeatureIndex(
                f"cluster {document['name']!r} member feature {member['feature_idx']} is past the "
                f"width of {binding.sae_id} ({width} features)",
                param="members",
            )
    return binding


def circuit_bindings(document: dict, attached: dict[str, Attached]) -> dict[int, LayerBinding]:
    """Each layer the circuit references (its SAEs and its members), bound or not."""
    refs = {ref["layer"]: ref for ref in document["saes"]}
    layers = sorted(set(refs) | {m["layer"] for m in document["members"]})
    return {layer: bind_layer(layer, refs.get(layer, {}), attached) for layer in layers}


def circuit_mode(bindings: dict[int, LayerBinding], members: list[Member]) -> str:
    """full (every member layer binds), slice_fallback (some do) or none."""
    layers = {m.layer for m in members}
    bound = {layer for layer in layers if layer is not None and bindings[layer].status in BOUND}
    if bound == layers and layers:
        return "full"
    return "slice_fallback" if bound else "none"


def members_strengths(
    members: list[Member],
    bindings: dict[int, LayerBinding],
    attached: dict[str, Attached],
    intensity: float,
) -> dict[str, dict[int, float]]:
    """The members' strengths on bound layers, per SAE: clamp(sign · strength · λ, ±200) each,
    from authored strengths, summed per feature (steering_edit clamps the sum to ±200).

    A member past the width of the SAE its layer binds to is refused (400 invalid_feature_index),
    never left out: a partial edit would be served as if it were the whole document.
    """
    strengths: dict[str, dict[int, float]] = {}
    for number, member in enumerate(members):
        binding = bindings.get(member.layer) if member.layer is not None else None
        if (
            binding is None or binding.status not in BOUND or binding.sae_id is None
        ):  # bound: it names its SAE
            continue
        width = attached[binding.sae_id].info.d_sae
        if member.feature_idx >= width:
            raise InvalidFeatureIndex(
                f"member {number} (feature {member.feature_idx} at layer {member.layer}) is past "
                f"the width of {binding.sae_id} ({width} features)",
                param="members",
            )
        features = strengths.setdefault(binding.sae_id, {})
        # Members on one feature add up; steering_edit clamps the sum once, so the order they are
        # listed in cannot change it (a running clamp would: 150, 150, -150 gave 50, not 150).
        features[member.feature_idx] = features.get(member.feature_idx, 0.0) + applied_strength(
            member.strength, member.sign, intensity
        )
    return strengths


def members_edit(
    members: list[Member],
    bindings: dict[int, LayerBinding],
    attached: dict[str, Attached],
    intensity: float,
) -> ResidualEdit | None:
    """The residual edit of the members on bound layers (members_strengths through the SAEs)."""
    return steering_edit(members_strengths(members, bindings, attached, intensity), attached)
