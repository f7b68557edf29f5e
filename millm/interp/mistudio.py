"""miStudio steering documents: cluster definitions (and bundles) and circuit definitions.

Validation follows shared/spec/formats.md field by field and lists every problem with its
location, so a bad document (or a bundle with one bad definition) is refused whole. Unknown
keys are allowed and kept: the stored document is the raw one. The evidence rung of a circuit
is the lowest rung among its edges (0 without edges); its phrase comes from the fixed ladder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from millm.errors import InvalidDocument

CLUSTER_KIND = "mistudio.cluster-definition"
CLUSTER_BUNDLE_KIND = "mistudio.cluster-bundle"
CIRCUIT_KIND = "mistudio.circuit-definition"
SCHEMA_VERSION = "1"

RUNG_LANGUAGE = {
    0: "associated",
    1: "suggested (attribution-supported)",
    2: "causally validated (edge)",
    3: "faithfulness-tested (circuit)",
}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Checker:
    """Collects problems with their locations."""

    def __init__(self):
        self.problems: list[str] = []

    def need(self, ok: bool, where: str, what: str) -> bool:
        if not ok:
            self.problems.append(f"{where}: {what}")
        return ok

    def optional_string(self, doc: dict, key: str, where: str, limit: int | None = None) -> None:
        if key in doc and doc[key] is not None:
            value = doc[key]
            if self.need(isinstance(value, str), f"{where}{key}", "must be a string") and limit is not None:
                self.need(len(value) <= limit, f"{where}{key}", f"at most {limit} characters")

    def header(self, doc: dict, kind: str) -> None:
        self.need(doc.get("kind") == kind, "kind", f"must be {kind!r}")
        self.need(doc.get("schema_version") == SCHEMA_VERSION, "schema_version", f"must be {SCHEMA_VERSION!r}")
        name = doc.get("name")
        self.need(isinstance(name, str) and 1 <= len(name) <= 120, "name", "required, 1-120 characters")
        self.optional_string(doc, "narrative", "", 10_000)
        for key in ("model", "provenance"):
            self.need(doc.get(key) is None or isinstance(doc[key], dict), key, "must be an object")
        provenance = doc.get("provenance") or {}
        if isinstance(provenance, dict):
            self.optional_string(provenance, "source_note", "provenance.", 500)

    def sae(self, sae, where: str) -> None:
        if not self.need(isinstance(sae, dict), where, "must be an object"):
            return
        for key in ("layer", "n_features", "d_model"):
            if sae.get(key) is not None:
                self.need(_int(sae[key]) and sae[key] >= 0, f"{where}.{key}", "a non-negative integer")
        hint = sae.get("source_hint")
        if hint is not None:
            self.need(isinstance(hint, str) and hint.startswith("hf:"), f"{where}.source_hint", "must look like hf:repo/path (never a local path)")

    def member(self, member, where: str) -> None:
        if not self.need(isinstance(member, dict), where, "must be an object"):
            return
        self.need(_int(member.get("feature_idx")) and member["feature_idx"] >= 0, f"{where}.feature_idx", "required, a non-negative integer")
        strength = member.get("strength")
        self.need(_number(strength) and -300 <= strength <= 300, f"{where}.strength", "required, a number in [-300, 300]")
        self.need(member.get("sign", 1) in (1, -1) and not isinstance(member.get("sign", 1), bool), f"{where}.sign", "1 or -1")
        similarity = member.get("similarity")
        if similarity is not None:
            self.need(_number(similarity) and 0 <= similarity <= 1, f"{where}.similarity", "a number in [0, 1]")
        if member.get("pinned") is not None:
            self.need(isinstance(member["pinned"], bool), f"{where}.pinned", "true or false")
        if member.get("meta") is not None:
            self.need(isinstance(member["meta"], dict), f"{where}.meta", "an object")
            top = (member.get("meta") or {}).get("top_tokens") if isinstance(member.get("meta"), dict) else None
            if top is not None:
                self.need(isinstance(top, list) and len(top) <= 10, f"{where}.meta.top_tokens", "a list of at most 10")

    def budget(self, budget, where: str) -> None:
        if budget is None:
            return
        if not self.need(isinstance(budget, dict), where, "must be an object"):
            return
        if "intensity" in budget:
            value = budget["intensity"]
            self.need(_number(value) and 0 <= value <= 2, f"{where}.intensity", "a number in [0, 2]")
        if "intensity_range" in budget:
            value = budget["intensity_range"]
            ok = isinstance(value, list) and len(value) == 2 and all(_number(v) and v >= 0 for v in value)
            if self.need(ok, f"{where}.intensity_range", "[lo, hi] with 0 <= lo <= hi"):
                self.need(value[0] <= value[1], f"{where}.intensity_range", "[lo, hi] with 0 <= lo <= hi")


def _refuse(checker: _Checker, what: str) -> None:
    if checker.problems:
        raise InvalidDocument(f"invalid {what}: " + "; ".join(checker.problems))


def check_cluster(doc, prefix: str = "") -> list[str]:
    """Problems of one cluster definition (locations prefixed), empty when valid."""
    checker = _Checker()
    if not isinstance(doc, dict):
        return [f"{prefix or 'document'}: must be an object"]
    checker.header(doc, CLUSTER_KIND)
    checker.sae(doc.get("sae", {}), "sae")
    members = doc.get("members")
    if checker.need(isinstance(members, list) and 1 <= len(members) <= 20, "members", "required, 1 to 20 members"):
        for i, member in enumerate(members):
            checker.member(member, f"members[{i}]")
    checker.budget(doc.get("budget"), "budget")
    return [f"{prefix}{p}" for p in checker.problems]


def cluster_definitions(doc) -> list[dict]:
    """The definitions of a cluster document or bundle, all valid, or InvalidDocument listing every problem."""
    if isinstance(doc, dict) and doc.get("kind") == CLUSTER_BUNDLE_KIND:
        checker = _Checker()
        checker.need(doc.get("schema_version") == SCHEMA_VERSION, "schema_version", f"must be {SCHEMA_VERSION!r}")
        definitions = doc.get("definitions")
        if checker.need(isinstance(definitions, list) and 1 <= len(definitions) <= 50, "definitions", "1 to 50 cluster definitions"):
            for i, definition in enumerate(definitions):
                checker.problems += check_cluster(definition, f"definitions[{i}].")
        _refuse(checker, "cluster bundle")
        return definitions
    problems = check_cluster(doc)
    if problems:
        raise InvalidDocument("invalid cluster definition: " + "; ".join(problems))
    return [doc]


def check_circuit(doc) -> None:
    """A valid circuit definition, or InvalidDocument listing every problem."""
    checker = _Checker()
    if not isinstance(doc, dict):
        raise InvalidDocument("invalid circuit definition: document: must be an object")
    checker.header(doc, CIRCUIT_KIND)
    saes = doc.get("saes")
    if checker.need(isinstance(saes, list) and 1 <= len(saes) <= 16, "saes", "required, 1 to 16 SAE references"):
        for i, sae in enumerate(saes):
            checker.sae(sae, f"saes[{i}]")
            checker.need(isinstance(sae, dict) and _int(sae.get("layer")), f"saes[{i}].layer", "required, an integer")
    members = doc.get("members")
    if checker.need(isinstance(members, list) and len(members) >= 1, "members", "required, at least one member"):
        for i, member in enumerate(members):
            where = f"members[{i}]"
            if not checker.need(isinstance(member, dict), where, "must be an object"):
                continue
            checker.need(_int(member.get("layer")) and member["layer"] >= 0, f"{where}.layer", "required, a non-negative integer")
            kind = member.get("member_kind", "feature_ref")
            if not checker.need(kind in ("feature_ref", "cluster_ref"), f"{where}.member_kind", "feature_ref or cluster_ref"):
                continue
            if kind == "feature_ref":
                checker.member(member.get("feature"), f"{where}.feature")
            else:
                expanded = member.get("expanded_members")
                if checker.need(isinstance(expanded, list) and 1 <= len(expanded) <= 20, f"{where}.expanded_members", "a cluster_ref carries 1 to 20 expanded members"):
                    for j, sub in enumerate(expanded):
                        checker.member(sub, f"{where}.expanded_members[{j}]")
    edges = doc.get("edges", [])
    if checker.need(isinstance(edges, list) and len(edges) <= 200, "edges", "at most 200 edges"):
        for i, edge in enumerate(edges):
            where = f"edges[{i}]"
            if not checker.need(isinstance(edge, dict), where, "must be an object"):
                continue
            checker.need(edge.get("rung", 0) in (0, 1, 2, 3) and not isinstance(edge.get("rung", 0), bool), f"{where}.rung", "0, 1, 2 or 3")
            if edge.get("type") is not None:
                checker.need(edge["type"] in ("computed", "persistence", "attention_mediated"), f"{where}.type", "computed, persistence or attention_mediated")
            for end in ("up", "down"):
                checker.need(isinstance(edge.get(end), dict), f"{where}.{end}", "required object")
    budget = doc.get("budget")
    checker.budget(budget, "budget")
    if isinstance(budget, dict) and budget.get("layers") is not None:
        if checker.need(isinstance(budget["layers"], dict), "budget.layers", "an object of per-layer budgets"):
            for layer, layer_budget in budget["layers"].items():
                checker.budget(layer_budget, f"budget.layers.{layer}")
    _refuse(checker, "circuit definition")


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
    """A steering member of a cluster or circuit: a feature, its authored strength and sign, its layer."""

    layer: int | None
    feature_idx: int
    strength: float
    sign: int


def cluster_members(doc: dict) -> list[Member]:
    """A cluster's members, at the cluster's layer."""
    layer = (doc.get("sae") or {}).get("layer")
    return [Member(layer, m["feature_idx"], float(m["strength"]), int(m.get("sign", 1))) for m in doc["members"]]


def circuit_members(doc: dict) -> list[Member]:
    """A circuit's members, cluster_refs expanded, each at its own layer."""
    found = []
    for member in doc["members"]:
        if member.get("member_kind", "feature_ref") == "feature_ref":
            subs = [member["feature"]]
        else:
            subs = member["expanded_members"]
        for sub in subs:
            found.append(Member(member["layer"], sub["feature_idx"], float(sub["strength"]), int(sub.get("sign", 1))))
    return found
