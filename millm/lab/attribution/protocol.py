"""Body and answer of POST /api/attribution: an attribution graph for one prompt and target."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from millm.interp.attribution.integrated import MAX_STEPS
from millm.lab.discovery.protocol import (
    ReadOne,
    Steering,
    SteeringUsed,
    TokenRead,
)
from millm.v1.policy.body_fields import StrictBody

MAX_VERIFIED = 32
TokenRef = Annotated[
    str | Annotated[int, Field(ge=0)],
    Field(description="A token: its id, or a string that encodes to exactly one token."),
]
Share = Annotated[float, Field(gt=0.0, le=1.0)]


class AttributionTarget(StrictBody):
    """What the graph explains at the prompt's last position: a token's logit (minus the mean
    logit), or with `versus` the difference of two logits."""

    token: TokenRef
    versus: TokenRef | None = None


class AttributionRequest(ReadOne):
    """POST /api/attribution: the graph of one text's or conversation's next-token logit."""

    target: AttributionTarget | None = Field(
        None, description="Default: the token the model itself predicts there."
    )
    saes: list[str] | None = Field(
        None,
        min_length=1,
        description="Attached SAEs whose features are the graph's nodes (default: every attached "
        "SAE, unless `transcoders` is given).",
    )
    transcoders: str | None = Field(
        None,
        description="A registered transcoder set (POST /api/transcoders) whose features replace "
        "the MLPs: with one on every block, the graph is circuit-tracer's exact one.",
    )
    max_feature_nodes: Annotated[int, Field(ge=1)] = Field(
        128, description="Features whose inputs are computed, most influential first."
    )
    node_threshold: Share = Field(
        0.8, description="Pruning keeps the nodes carrying this share of influence."
    )
    edge_threshold: Share = Field(0.98, description="... and the edges carrying this share.")
    max_edges: Annotated[int, Field(ge=1, le=20_000)] = Field(
        2000, description="At most this many edges are returned, the strongest."
    )
    verify: Annotated[int, Field(ge=0, le=MAX_VERIFIED)] = Field(
        8,
        description="Top feature nodes ablated on the served model to check the graph's "
        "predictions.",
    )
    integrated_gradients: Annotated[int, Field(ge=0, le=MAX_STEPS)] = Field(
        0,
        description="Steps of integrated gradients along each source's path (0: gradient x "
        "activation); an attribution-patching graph only (a transcoder on every block is linear "
        "already).",
    )
    steering: Steering = None


NodeKind = Literal["feature", "error", "token", "target"]


class GraphNode(BaseModel):
    """One node. `id` is circuit-tracer's node id; `layer` the block after which it writes (-1:
    the embeddings; the target: the number of blocks)."""

    id: str
    kind: NodeKind
    layer: int
    position: int
    sae_id: str | None = Field(
        None, description="The SAE, or transcoder_set/block, the feature belongs to."
    )
    site: Literal["resid", "mlp"] | None = Field(
        None, description="resid: an SAE after its block; mlp: a transcoder of its block's MLP."
    )
    feature: int | None = None
    label: str | None = None
    activation: float | None = None
    token_id: int | None = None
    token: str | None = None
    influence: float = Field(
        description="Share of the output's total influence reached by the nodes at least this "
        "influential (circuit-tracer's cumulative influence)."
    )


class GraphEdge(BaseModel):
    """A direct effect: how much `source` adds to `target`'s value (a feature's pre-activation,
    the target's logit)."""

    source: str
    target: str
    weight: float


class TargetRead(BaseModel):
    """The explained quantity: Σ coefficient · (logit − mean logit) over these tokens."""

    token_ids: list[int]
    tokens: list[str]
    coefficients: list[float]
    value: float = Field(description="In the replacement pass.")
    probability: float = Field(description="Of the first token, in the replacement pass.")


class SourceRead(BaseModel):
    """A feature source of the graph."""

    sae_id: str
    layer: int
    site: Literal["resid", "mlp"]
    active_features: int


class NodeCheck(BaseModel):
    """A feature node ablated alone on the served model."""

    node: str
    label: str | None = None
    predicted: float = Field(
        description="The target's change the graph predicts (minus the node's total effect)."
    )
    measured: float = Field(description="The change the served model shows.")


class Verification(BaseModel):
    """Predicted against measured over the checked nodes."""

    method: Literal["ablation"] = "ablation"
    served_value: float = Field(description="The target's value in the served model.")
    nodes: list[NodeCheck]
    correlation: float | None
    passed: bool
    pass_correlation: float


class AttributionGraph(BaseModel):
    """A pruned attribution graph and how well it holds."""

    object: Literal["attribution_graph"] = "attribution_graph"
    id: str
    model: str
    method: Literal["transcoders", "attribution patching", "integrated gradients", "imported"]
    steered: bool
    steering: SteeringUsed
    tokens: list[TokenRead]
    target: TargetRead
    sources: list[SourceRead]
    expanded_features: int
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    replacement_score: float | None = Field(description="None for an imported graph.")
    completeness_score: float | None
    node_threshold: float
    edge_threshold: float
    verification: Verification | None
    seconds: float


class SubgraphProfile(StrictBody):
    """POST /api/attribution/{id}/profile: a graph's chosen feature nodes as a steering profile
    (features at several positions steer once: a profile steers every position)."""

    name: str = Field(description="The profile's name (a profile's name rules).")
    description: str | None = None
    nodes: Annotated[list[str], Field(min_length=1, max_length=256)]
    op: Literal["ablate", "add"] = "ablate"
    strength: float | None = Field(None, description="With add: the strength (±200).")

    @model_validator(mode="after")
    def _strength_with_add(self) -> SubgraphProfile:
        if (self.op == "add") != (self.strength is not None):
            raise ValueError("give strength with op add, and only then")
        return self


class SubgraphCircuit(StrictBody):
    """POST /api/attribution/{id}/circuit: a graph's chosen feature nodes as a miStudio circuit."""

    name: str = Field(description="The circuit's name.")
    narrative: str | None = None
    nodes: Annotated[list[str], Field(min_length=1, max_length=256)]
    strength: Annotated[float, Field(ge=-300, le=300)] = Field(
        description="Each member's strength (a circuit member's range; applied within ±200)."
    )


class ImportedNode(BaseModel):
    """A node of circuit-tracer's graph JSON (what millm reads of it; other fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    node_id: str
    feature: int | None = None
    layer: str
    ctx_idx: int
    feature_type: str
    token_prob: float = 0.0
    is_target_logit: bool = False
    clerp: str = ""
    influence: float | None = None
    activation: float | None = None


class ImportedMetadata(BaseModel):
    """circuit-tracer's graph metadata (what millm reads of it)."""

    model_config = ConfigDict(extra="ignore")

    slug: str
    scan: str | None = None
    prompt_tokens: list[str]
    node_threshold: float | None = None


class ImportedLink(BaseModel):
    """A link of circuit-tracer's graph JSON."""

    model_config = ConfigDict(extra="ignore")

    source: str
    target: str
    weight: float


class ImportedGraph(BaseModel):
    """A graph file as circuit-tracer's create_graph_files writes it (and Neuronpedia serves it)."""

    model_config = ConfigDict(extra="ignore")

    metadata: ImportedMetadata
    nodes: Annotated[list[ImportedNode], Field(min_length=1)]
    links: list[ImportedLink]


class TranscoderRegistration(StrictBody):
    """POST /api/transcoders: a transcoder set directory (circuit-tracer's config.yaml and
    files)."""

    path: str = Field(description="Inside the data directory or MILLM_ALLOWED_PATHS.")
