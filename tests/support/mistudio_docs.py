"""miStudio cluster and circuit documents for tests (shaped for the tiny models: width 128)."""

from __future__ import annotations

import json


def cluster(
    name="river-cluster",
    layer=1,
    n_features=128,
    members=None,
    intensity_range=None,
    extra=None,
    intensity=None,
):
    """A valid cluster definition with unknown keys sprinkled in (they must survive export)."""
    doc = {
        "kind": "mistudio.cluster-definition",
        "schema_version": "1",
        "name": name,
        "narrative": "features about rivers",
        "x_unknown_top": {"kept": [1, 2, 3]},
        "sae": {
            "mistudio_sae_id": "ms-sae-1",
            "layer": layer,
            "hook_type": "resid_post",
            "n_features": n_features,
            "d_model": 64,
            "source_hint": "hf:acme/saes/l1",
        },
        "members": members
        or [
            {
                "feature_idx": 3,
                "strength": 10.0,
                "sign": 1,
                "label": "river",
                "meta": {"category": "x", "top_tokens": ["a"]},
                "x_member_extra": True,
            },
            {"feature_idx": 7, "strength": 20.0, "sign": -1, "label": "bank"},
            {"feature_idx": 9, "strength": 150.0},
        ],
        "budget": {"B": 1.0, "intensity": 1.0 if intensity is None else intensity},
        "provenance": {"mistudio_version": "9.9", "source_note": "test"},
    }
    if intensity_range is not None:
        doc["budget"]["intensity_range"] = intensity_range
    doc.update(extra or {})
    return doc


def circuit(
    name="two-layer-circuit",
    rungs=(2, 3),
    layers=(1, 2),
    n_features=(128, 128),
    intensity_range=None,
    extra=None,
):
    """A valid circuit over two layers: a feature_ref at the first, a cluster_ref at the second."""
    doc = {
        "kind": "mistudio.circuit-definition",
        "schema_version": "1",
        "name": name,
        "narrative": "x",
        "x_circuit_extra": "kept",
        "saes": [
            {"mistudio_sae_id": f"ms-{layer}", "layer": layer, "n_features": width}
            for layer, width in zip(layers, n_features, strict=True)
        ],
        "members": [
            {
                "layer": layers[0],
                "member_kind": "feature_ref",
                "feature": {"feature_idx": 4, "strength": 30.0, "sign": 1},
            },
            {
                "layer": layers[1],
                "member_kind": "cluster_ref",
                "cluster_profile_id": "c1",
                "cluster_name": "c",
                "expanded_members": [
                    {"feature_idx": 5, "strength": 40.0, "sign": -1},
                    {"feature_idx": 6, "strength": 150.0},
                ],
            },
        ],
        "edges": [
            {
                "up": {"layer": layers[0], "feature_idx": 4, "kind": "feature"},
                "down": {"layer": layers[1], "feature_idx": 5, "kind": "feature"},
                "type": "computed",
                "rung": r,
            }
            for r in rungs
        ],
        "budget": {"intensity": 1.0, "layers": {str(layers[0]): {"intensity": 1.0}}},
    }
    if intensity_range is not None:
        doc["budget"]["intensity_range"] = intensity_range
    doc.update(extra or {})
    return doc


def raw(doc) -> bytes:
    """Bytes with unusual spacing and key order, so a byte-for-byte export is a real check."""
    return ("{\n   " + json.dumps(doc, indent=3)[1:]).encode()
