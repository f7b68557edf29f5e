"""GET /api/vectors/{id}/explain: a steering vector decomposed over an SAE's decoder, with labels.

The SAE must read the residual the vector was trained on: the same engine point (resid_pre of
layer L+1 is resid_post of layer L, the same residual) and the same width. An SAE at another
point is refused (400), not answered with a warning: its decoder rows are directions of another
layer's residual, and cosines against them would be numbers that mean nothing. The SAE need not
be attached (its decoder is read from its file, as GET /api/saes/{id}/features/{index} does,
through the same bounded decoder cache); its layer is where it is attached, else its file's hook
layer. Without `sae_id`, the one SAE attached at the vector's point is used.
"""

from __future__ import annotations

from millm.errors import InvalidRequest
from millm.interp.sae_files import SAEInfo
from millm.interp.steering import residual_point
from millm.interp.vectors import decompose
from millm.kernel.steering.decoders import Decoder
from millm.lab.discovery.inputs import label_of
from millm.lab.vectors.parts import VectorParts
from millm.lab.vectors.protocol import ExplainedFeature, VectorExplanation

MISMATCH = "vector_sae_mismatch"


def _where(state: VectorParts, info: SAEInfo) -> int | None:
    """The layer an SAE reads: where it is attached, else its file's hook layer (None: neither
    says)."""
    # a copy, not the lock: this runs on the event loop
    attached = dict(state.steering.attached).get(info.id)
    return attached.layer if attached is not None else info.layer


def _sae_at_point(state: VectorParts, row: dict) -> SAEInfo:
    """The one attached SAE at the vector's point (400 naming sae_id when none or several are)."""
    point = residual_point(row["layer"], row["hook_point"])
    found = sorted(a.info.id for a in dict(state.steering.attached).values() if a.point == point)
    if len(found) != 1:
        what = f"several are ({', '.join(found)})" if found else "none is"
        raise InvalidRequest(
            f"no sae_id given, and an SAE attached at the vector's point (layer {row['layer']}, "
            f"{row['hook_point']}) explains it by default: {what}; name one",
            param="sae_id",
        )
    return state.saes.get(found[0])


def check_same_point(row: dict, info: SAEInfo, layer: int | None) -> int:
    """The SAE's layer when it reads the vector's residual (point and width); 400
    vector_sae_mismatch naming sae_id otherwise."""
    if layer is None:
        raise InvalidRequest(
            f"{info.id} names no layer (its file has no hook layer) and is not attached; attach "
            "it at a layer first",
            param="sae_id",
        )
    if residual_point(layer, info.hook_point) != residual_point(row["layer"], row["hook_point"]):
        raise InvalidRequest(
            f"{info.id} reads layer {layer} ({info.hook_point}), but vector {row['name']!r} was "
            f"trained at layer {row['layer']} ({row['hook_point']}); an SAE explains only a "
            "vector of its own residual",
            param="sae_id",
            code=MISMATCH,
        )
    if info.d_in != row["d_model"]:
        raise InvalidRequest(
            f"{info.id} reads vectors of width {info.d_in}, but vector {row['name']!r} has "
            f"d_model {row['d_model']}",
            param="sae_id",
            code=MISMATCH,
        )
    return layer


def _explanation(
    state: VectorParts, row: dict, info: SAEInfo, layer: int, decoder: Decoder, k: int
) -> VectorExplanation:
    """The decomposition and the labels (numpy and a store read: a worker thread)."""
    parts = decompose(row["unit"], decoder.unit, k)
    labels = state.labels.entries(info.id)
    features = [
        ExplainedFeature(
            index=p.index, label=label_of(labels, p.index), cosine=p.cosine, cumulative=p.cumulative
        )
        for p in parts
    ]
    return VectorExplanation(
        vector_id=row["id"],
        name=row["name"],
        sae_id=info.id,
        layer=layer,
        hook_point=info.hook_point,
        k=len(parts),
        fraction_explained=parts[-1].cumulative,
        features=features,
    )
