"""Bodies and answers of /api/vectors: train a steering vector from prompt pairs, read it,
explain it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from millm.formats.document_schemas import MAX_DESCRIPTION, ProfileName
from millm.formats.vector_file import HookPoint
from millm.lab.discovery.protocol import MAX_TOP_K, Conversation, ModelName
from millm.v1.policy.body_fields import StrictBody

Side = Annotated[
    Annotated[str, Field(min_length=1)] | Conversation,
    Field(
        description="A text (encoded as /v1/completions encodes a prompt) or a conversation "
        "(rendered with the chat template)."
    ),
]


class VectorPair(StrictBody):
    """Two texts that differ by the concept: the vector points from `negative` towards
    `positive`."""

    positive: Side
    negative: Side


class TrainVectorRequest(StrictBody):
    """POST /api/vectors/train: a steering vector from contrasting pairs, read unsteered at one
    residual point."""

    name: ProfileName
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] = ""
    model: ModelName = None
    layer: Annotated[int, Field(ge=0, description="The decoder block whose residual is read.")]
    hook_point: HookPoint = Field(
        "resid_post", description="resid_post: after block `layer`; resid_pre: before it."
    )
    method: Literal["mean", "pca"] = Field(
        "mean",
        description="mean: difference of means; pca: the pairs' differences' first principal "
        "direction.",
    )
    pairs: Annotated[list[VectorPair], Field(min_length=1)]


class ExplainedFeature(BaseModel):
    """A feature in a vector's explanation."""

    index: int
    label: str | None
    # between its decoder row and the vector (signed: negative means the vector pushes against it)
    cosine: float
    cumulative: float  # the fraction of the vector explained by the features up to this one


class VectorExplanation(BaseModel):
    """A vector decomposed over an SAE's decoder: the top-k features by |cosine| and the fraction
    they explain."""

    object: str = "vector.explanation"
    vector_id: str
    name: str
    sae_id: str
    layer: int
    hook_point: str
    k: int
    fraction_explained: (
        float  # ‖projection onto the span of the k features' decoder rows‖² / ‖vector‖²
    )
    features: list[ExplainedFeature]


ExplainK = Annotated[
    int, Field(ge=1, le=MAX_TOP_K, description=f"Features listed (1-{MAX_TOP_K}).")
]
