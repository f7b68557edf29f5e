"""miStudio steering documents: cluster definitions (and bundles) and circuit definitions.

Validation is by the models in document_schemas.py (shared/spec/formats.md field by field) and
lists every problem with its JSON location, so a bad document (or a bundle with one bad
definition) is refused whole. Unknown keys are allowed and kept: the stored document is the raw
one, so what callers get back is the raw dict. The evidence rung of a circuit is the lowest rung
among its edges (0 without edges); its phrase comes from the fixed ladder.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.errors import InvalidDocument
from millm.formats.document_fields import validate_document
from millm.formats.document_schemas import CLUSTER_BUNDLE_KIND
from millm.formats.mistudio_schemas import CircuitDefinition, ClusterBundle, ClusterDefinition

RUNG_LANGUAGE = {
    0: "associated",
    1: "suggested (attribution-supported)",
    2: "causally validated (edge)",
    3: "faithfulness-tested (circuit)",
}


def cluster_definitions(doc) -> list[dict]:
    """The definitions of a cluster document or bundle, all valid, or InvalidDocument listing
    every problem."""
    if isinstance(doc, dict) and doc.get("kind") == CLUSTER_BUNDLE_KIND:
        validate_document(ClusterBundle, doc, InvalidDocument, "cluster bundle")
        return doc["definitions"]
    validate_document(ClusterDefinition, doc, InvalidDocument, "cluster definition")
    return [doc]


def check_circuit(doc) -> None:
    """A valid circuit definition, or InvalidDocument listing every problem."""
    validate_document(CircuitDefinition, doc, InvalidDocument, "circuit definition")


def declared_range(doc: dict) -> tuple[float, float] | None:
    """The budget's intensity_range, only if the raw document declares one."""
    budget = doc.get("budget")
    if isinstance(budget, dict) and isinstance(budget.get("intensity_range"), list):
        lo, hi = budget["intensity_range"]
        return float(lo), float(hi)
    return None


def authored_intensity(doc: dict) -> float:
    """budget.intensity, 1 when absent."""
    budget = doc.get("budget")
    value = budget.get("intensity") if isinstance(budget, dict) else None
    return float(value) if value is not None else 1.0


def rung(doc: dict) -> int:
    """The circuit's evidence rung: the lowest rung among its edges; no edges is rung 0."""
    edges = doc.get("edges") or []
    return min((int(edge.get("rung", 0)) for edge in edges), default=0)


@dataclass(frozen=True)
class Member:
    """A steering member of a cluster or circuit: a feature, its authored strength and sign, its
    layer."""

    layer: int | None
    feature_idx: int
    strength: float
    sign: int


def cluster_members(doc: dict) -> list[Member]:
    """A cluster's members, at the cluster's layer."""
    layer = (doc.get("sae") or {}).get("layer")
    return [
        Member(layer, m["feature_idx"], float(m["strength"]), int(m.get("sign", 1)))
        for m in doc["members"]
    ]


def circuit_members(doc: dict) -> list[Member]:
    """A circuit's members, cluster_refs expanded, each at its own layer."""
    found = []
    for member in doc["members"]:
        if member.get("member_kind", "feature_ref") == "feature_ref":
            subs = [member["feature"]]
        else:
            subs = member["expanded_members"]
        for sub in subs:
            found.append(
                Member(
                    member["layer"],
                    sub["feature_idx"],
                    float(sub["strength"]),
                    int(sub.get("sign", 1)),
                )
            )
    return found
