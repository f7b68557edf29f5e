"""The imported documents' formats as pydantic models: one definition validates them and states
them.

This module holds millm's profiles; document_fields.py what every document shares (validation with
JSON locations, field types); mistudio_schemas.py miStudio's definitions. profiles.py and
mistudio.py validate with these models, listing every problem with its JSON location
(`steering[0].features[3].strength: ...`); document_json_schemas.py states the same models as JSON
Schema for the served OpenAPI schema. What JSON Schema cannot say is checked by validators on the
fields concerned: names unique within a bundle, feature indices unique within an entry, an SAE (or a
vector) named once per profile and condition, a probe once in `abort`, a version 1 profile holding
only added features, and `lo <= hi` in an intensity range. A feature's or vector's `op` picks its
model (absent: add), so each op's fields are stated as JSON Schema too. The fuzz test checks that
what these schemas allow, the validators accept. miStudio models keep unknown keys (the stored
document is the raw one); profile documents drop them (the stored document is the canonical form).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

from millm.formats.detectors import Detector
from millm.formats.document_fields import (
    STRENGTH_LIMIT,
    Document,
    NonNegative,
    no_bools,
    refusal,
    said,
    unique,
)

# The kinds and versions as types (the models' fields) and as values; mypy checks that they agree.
ProfileKind = Literal["millm.profile"]
BundleKind = Literal["millm.profile-bundle"]
ProfileVersion = Literal[1, 2]
PROFILE_KIND: ProfileKind = "millm.profile"
BUNDLE_KIND: BundleKind = "millm.profile-bundle"
VERSION: ProfileVersion = (
    2  # what millm writes; version 1 documents are read as version 2 (every feature added)
)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._\-]{0,119}$"
MAX_DESCRIPTION = 2000
MAX_BUNDLE = 500
MAX_REFERENCE = 200  # a probe name or a vector id

ClusterKind = Literal["mistudio.cluster-definition"]
ClusterBundleKind = Literal["mistudio.cluster-bundle"]
CircuitKind = Literal["mistudio.circuit-definition"]
MistudioVersion = Literal["1"]
CLUSTER_KIND: ClusterKind = "mistudio.cluster-definition"
CLUSTER_BUNDLE_KIND: ClusterBundleKind = "mistudio.cluster-bundle"
CIRCUIT_KIND: CircuitKind = "mistudio.circuit-definition"
SCHEMA_VERSION: MistudioVersion = "1"

Version = Annotated[ProfileVersion, no_bools("1 or 2")]
Sign = Annotated[Literal[1, -1], no_bools("1 or -1")]
Rung = Annotated[Literal[0, 1, 2, 3], no_bools("0, 1, 2 or 3")]
ProfileName = Annotated[
    str,
    Field(pattern=NAME_PATTERN),
    said(
        "1-120 characters of letters, digits, space, '.', '_' or '-', starting with a letter or "
        "digit"
    ),
]
SourceHint = Annotated[
    str, Field(pattern="^hf:"), said("must look like hf:repo/path (never a local path)")
]


# ---- millm profiles -----------------------------------------------------------------------------
Strength = Annotated[float, Field(ge=-STRENGTH_LIMIT, le=STRENGTH_LIMIT)]
Level = Annotated[float, Field(ge=0)]
# A field that belongs to other operators: null or absent, else refused in words that say which.
NoStrength = Annotated[
    None, said("strength is for op add only (clamp and cap take value, ablate takes neither)")
]
NoValue = Annotated[
    None, said("value is for op clamp and cap only (add takes strength, ablate takes neither)")
]
ProbeName = Annotated[str, Field(min_length=1, max_length=MAX_REFERENCE)]
Reference = Annotated[str, Field(min_length=1, max_length=MAX_REFERENCE)]


class When(Document):
    """A condition: apply the entry from the position after `probe` first fires, for `tokens`
    positions (null: the rest of the row). `probe` names a saved probe, or, with `detector`, the
    probe this document defines for itself (no saved probe needed, none consulted)."""

    probe: ProbeName
    tokens: Annotated[int, Field(gt=0)] | None = None
    detector: Detector | None = None


class FeatureAdd(Document):
    """Add strength · W_dec[index] at every position (the default op; strength within ±200)."""

    index: NonNegative
    op: Literal["add"] = "add"
    strength: Strength
    value: NoValue = None


class FeatureClamp(Document):
    """Hold the feature's encoded activation at `value` at every position."""

    index: NonNegative
    op: Literal["clamp"]
    value: Level
    strength: NoStrength = None


class FeatureAblate(Document):
    """Hold the feature's encoded activation at 0 wherever it fires."""

    index: NonNegative
    op: Literal["ablate"]
    strength: NoStrength = None
    value: NoValue = None


class FeatureCap(Document):
    """Limit the residual's component along the feature's unit decoder row to at most `value`."""

    index: NonNegative
    op: Literal["cap"]
    value: Level
    strength: NoStrength = None


def _op(default: str):
    # Absent means the default op; anything but an object is checked as the default (and refused as
    # "must be an object"). A model (when a document is dumped) says its own op.
    def tag(item: Any) -> Any:
        if isinstance(item, BaseModel):
            return getattr(item, "op", default)
        return item.get("op", default) if isinstance(item, dict) else default

    return tag


ProfileFeature = Annotated[
    Annotated[FeatureAdd, Tag("add")]
    | Annotated[FeatureClamp, Tag("clamp")]
    | Annotated[FeatureAblate, Tag("ablate")]
    | Annotated[FeatureCap, Tag("cap")],
    Discriminator(
        _op("add"),
        custom_error_type="op",
        custom_error_message="op must be one of add, clamp, ablate, cap",
    ),
]


def _condition(when: When | None) -> str:
    return "" if when is None else f" (when {when.probe})"


class ProfileDocumentEntry(Document):
    """One SAE's features; `layer` when it is attached elsewhere than its own hook layer; `when`
    to apply them only once a probe fires."""

    sae_id: Annotated[str, Field(min_length=1)]
    layer: NonNegative | None = None
    features: Annotated[
        list[ProfileFeature], unique(lambda f: f.index, "feature {twice} appears twice")
    ]
    when: When | None = None


class VectorAdd(Document):
    """Add strength · the vector's unit direction at every position."""

    vector_id: Reference
    op: Literal["add"] = "add"
    strength: Strength
    value: NoValue = None
    when: When | None = None


class VectorCap(Document):
    """Limit the residual's component along the vector's unit direction to at most `value`."""

    vector_id: Reference
    op: Literal["cap"]
    value: Level
    strength: NoStrength = None
    when: When | None = None


VectorEntry = Annotated[
    Annotated[VectorAdd, Tag("add")] | Annotated[VectorCap, Tag("cap")],
    Discriminator(
        _op("add"), custom_error_type="op", custom_error_message="a vector's op must be add or cap"
    ),
]


class AbortEntry(Document):
    """A probe whose firing ends the row (finish_reason content_filter): a saved probe's name, or
    a name and the `detector` defined here."""

    probe: ProbeName
    detector: Detector | None = None


SteeringEntries = Annotated[
    list[ProfileDocumentEntry],
    unique(
        lambda e: e.sae_id + _condition(e.when),
        "{twice} appears twice; give one entry per SAE (and condition)",
    ),
]
VectorEntries = Annotated[
    list[VectorEntry],
    unique(
        lambda v: v.vector_id + _condition(v.when),
        "{twice} appears twice; give one entry per vector (and condition)",
    ),
]
AbortEntries = Annotated[
    list[AbortEntry], unique(lambda a: a.probe, "probe {twice} appears twice in abort")
]


class SteeringSpec(Document):
    """What steers: SAE features (`steering`), steering vectors (`vectors`) and probes that end the
    row (`abort`). A profile document's steering part, and the body of a request's own `steering`
    field."""

    steering: SteeringEntries = []
    vectors: VectorEntries = []
    abort: AbortEntries = []


# _version_1_only_adds below, as JSON Schema.
VERSION_1_RULE: dict[str, Any] = {
    "if": {"required": ["version"], "properties": {"version": {"const": 1}}},
    "then": {
        "properties": {
            "vectors": {"maxItems": 0},
            "abort": {"maxItems": 0},
            "steering": {
                "items": {
                    "properties": {
                        "when": {"type": "null"},
                        "features": {"items": {"properties": {"op": {"const": "add"}}}},
                    }
                }
            },
        }
    },
}


class ProfileDocument(SteeringSpec):
    """A millm.profile document: a named steering spec (version 1: features only, all added)."""

    model_config = ConfigDict(json_schema_extra={"allOf": [VERSION_1_RULE]})

    kind: ProfileKind = PROFILE_KIND
    version: Version = VERSION
    name: ProfileName
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] = ""

    @model_validator(mode="after")
    def _version_1_only_adds(self):
        # A version 1 document meant "add every feature"; what came with version 2 is refused there,
        # not reread.
        if self.version == 1:
            newer = any(not isinstance(f, FeatureAdd) for e in self.steering for f in e.features)
            if (
                newer
                or self.vectors
                or self.abort
                or any(e.when is not None for e in self.steering)
            ):
                raise refusal(
                    "document_rule",
                    "version 1 documents only add features: op, when, vectors and abort need "
                    "version 2",
                )
        return self


class ProfileBundle(Document):
    """A millm.profile-bundle: 1-500 profiles with distinct names."""

    kind: BundleKind
    version: Version = VERSION
    profiles: Annotated[
        list[ProfileDocument],
        Field(min_length=1, max_length=MAX_BUNDLE),
        unique(lambda p: p.name, "names appear twice: {twice}"),
    ]
