"""miStudio's cluster and circuit definitions (shared/spec/formats.md) as pydantic models: one
definition validates an import and states its JSON Schema. They keep unknown keys: the stored
document is the raw one."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag

from millm.formats.document_fields import Document, NonNegative, _ordered
from millm.formats.document_schemas import (
    CircuitKind,
    ClusterBundleKind,
    ClusterKind,
    MistudioVersion,
    Rung,
    Sign,
    SourceHint,
)


# ---- miStudio cluster and circuit definitions (shared/spec/formats.md) --------------------------
class MistudioMemberMeta(Document):
    """Display data only: it never changes the steering math."""

    top_tokens: Annotated[list, Field(max_length=10)] | None = None


class MistudioMember(Document):
    """A cluster member: a feature, its authored strength and sign."""

    feature_idx: NonNegative
    strength: Annotated[float, Field(ge=-300, le=300)]
    sign: Sign = 1
    similarity: Annotated[float, Field(ge=0, le=1)] | None = None
    pinned: bool | None = None
    meta: MistudioMemberMeta | None = None  # display data only: never read by the steering math


class MistudioSae(Document):
    """Which SAE a definition was made on."""

    layer: NonNegative | None = None
    n_features: NonNegative | None = None
    d_model: NonNegative | None = None
    source_hint: SourceHint | None = None


class MistudioBudget(Document):
    """The authored intensity and, when declared, the range its dial spans."""

    intensity: Annotated[float, Field(ge=0, le=2)] = 1.0
    intensity_range: (
        Annotated[
            list[Annotated[float, Field(ge=0)]],
            Field(min_length=2, max_length=2),
            AfterValidator(_ordered),
        ]
        | None
    ) = None


class MistudioProvenance(Document):
    """Where the definition comes from."""

    source_note: Annotated[str, Field(max_length=500)] | None = None


class MistudioDefinition(Document):
    """The header a cluster and a circuit share."""

    name: Annotated[str, Field(min_length=1, max_length=120)]
    narrative: Annotated[str, Field(max_length=10_000)] | None = None
    model: dict[str, Any] | None = None
    provenance: MistudioProvenance | None = None


Members = Annotated[list[MistudioMember], Field(min_length=1, max_length=20)]


class ClusterDefinition(MistudioDefinition):
    """A mistudio.cluster-definition: 1-20 features of one SAE."""

    kind: ClusterKind
    schema_version: MistudioVersion
    sae: MistudioSae = Field(default_factory=MistudioSae)
    members: Members
    budget: MistudioBudget | None = None


class ClusterBundle(Document):
    """A mistudio.cluster-bundle: 1-50 cluster definitions."""

    kind: ClusterBundleKind
    schema_version: MistudioVersion
    definitions: Annotated[list[ClusterDefinition], Field(min_length=1, max_length=50)]


class MistudioCircuitSae(MistudioSae):
    """An SAE a circuit reads at its layer."""

    layer: NonNegative


class CircuitFeatureRef(Document):
    """A circuit member that is one feature."""

    layer: NonNegative
    member_kind: Literal["feature_ref"] = "feature_ref"
    feature: MistudioMember


class CircuitClusterRef(Document):
    """A circuit member that is a cluster, expanded."""

    layer: NonNegative
    member_kind: Literal["cluster_ref"]
    expanded_members: Members  # the expansion travels with the file, so it is self-contained


def _member_kind(member: Any) -> str:
    # Absent is feature_ref; anything but an object is checked as one (and refused as "must be an
    # object").
    return member.get("member_kind", "feature_ref") if isinstance(member, dict) else "feature_ref"


CircuitMember = Annotated[
    Annotated[CircuitFeatureRef, Tag("feature_ref")]
    | Annotated[CircuitClusterRef, Tag("cluster_ref")],
    Discriminator(
        _member_kind,
        custom_error_type="member_kind",
        custom_error_message="member_kind must be feature_ref or cluster_ref",
    ),
]


class CircuitEdge(Document):
    """An edge between two members, with its evidence rung."""

    up: dict[str, Any]
    down: dict[str, Any]
    rung: Rung = 0
    type: Literal["computed", "persistence", "attention_mediated"] | None = None


class MistudioCircuitBudget(MistudioBudget):
    """A circuit's budget, with per-layer budgets."""

    layers: dict[str, MistudioBudget | None] | None = None


class CircuitDefinition(MistudioDefinition):
    """A mistudio.circuit-definition: members over several layers and the edges between them."""

    kind: CircuitKind
    schema_version: MistudioVersion
    saes: Annotated[list[MistudioCircuitSae], Field(min_length=1, max_length=16)]
    members: Annotated[list[CircuitMember], Field(min_length=1)]
    edges: Annotated[list[CircuitEdge], Field(max_length=200)] = []
    budget: MistudioCircuitBudget | None = None
