"""Bodies and answers of the discovery reads: POST /api/saes/{id}/inspect and
/api/saes/{id}/contrast.

Requests are strict and refuse unknown keys (a misspelt `top_k` must not pass for the default).
What depends on the server (the SAE's width, the caps in settings, the model's tokenizer and
context window, which SAEs are attached) is checked by the service, in the order a client
would fix it, before any forward pass.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from millm.interp.intensity import STRENGTH_LIMIT
from millm.v1.policy.body_fields import StrictBody
from millm.v1.serving.protocol import MESSAGE_RULES, ChatMessage


def one_of(body: BaseModel, first: str, second: str) -> None:
    """Exactly one of two fields, sent with a value: the schema's `oneOf` of `required`s (a second
    field sent as null still counts as sent there, so it is refused here too)."""
    sent = [name for name in (first, second) if name in body.model_fields_set]
    if len(sent) != 1 or getattr(body, sent[0]) is None:
        raise ValueError(f"give either {first} or {second}")


MAX_TOP_K = 256  # features one answer lists (per side for a contrast): a page shows a few dozen
Sort = Literal["max", "mean", "count"]
Aggregate = Literal["max", "mean"]
# what ChatMessage's validator checks, for the served schema
MESSAGE_SCHEMA: dict[str, Any] = {"allOf": MESSAGE_RULES}


class DiscoveryMessage(ChatMessage):
    """A chat message as /v1/chat/completions takes it, without unknown keys (nothing here would
    report them)."""

    model_config = ConfigDict(strict=True, extra="forbid", json_schema_extra=MESSAGE_SCHEMA)


Conversation = Annotated[list[DiscoveryMessage], Field(min_length=1)]
TopK = Annotated[int, Field(ge=1, le=MAX_TOP_K, description=f"Features listed (1-{MAX_TOP_K}).")]
ModelName = Annotated[
    str | None, Field(description="The model to read with (default: the loaded model).")
]


class SteerFeature(StrictBody):
    """One feature to add at `strength` × W_dec[index] (the inspected SAE unless `sae_id` names
    another attached one)."""

    sae_id: str | None = None
    index: Annotated[int, Field(ge=0)]
    # The bound is stated here and enforced by check_strength, whose message names the limit.
    strength: Annotated[
        float, Field(json_schema_extra={"minimum": -STRENGTH_LIMIT, "maximum": STRENGTH_LIMIT})
    ]


class SteerWith(StrictBody):
    """A steering plan for the read: a saved profile (name or id), or feature strengths."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["profile"]}, {"required": ["features"]}]}
    )

    profile: Annotated[str, Field(min_length=1)] | None = None
    features: Annotated[list[SteerFeature], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_plan(self) -> SteerWith:
        one_of(self, "profile", "features")
        return self


Steering = Annotated[
    Literal["live"] | SteerWith | None,
    Field(
        description='Unsteered when absent; "live" is the server\'s current steering (as a /v1 '
        'request gets it), or {"profile": name or id}, or {"features": [{"sae_id"?, "index", '
        '"strength"}]}.'
    ),
]


class ReadOne(StrictBody):
    """One text (encoded as /v1/completions encodes a prompt) or one conversation (rendered with the
    chat template, as /v1/chat/completions does) read on a model: inspect, the lens, attribution."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["text"]}, {"required": ["messages"]}]}
    )

    model: ModelName = None
    text: str | None = None
    messages: Conversation | None = None

    @model_validator(mode="after")
    def _one_input(self) -> ReadOne:
        one_of(self, "text", "messages")
        return self


class InspectRequest(ReadOne):
    """POST /api/saes/{id}/inspect: the features that fire on one text or conversation."""

    top_k: TopK = 20
    sort: Sort = Field(
        "max",
        description="Rank by the max over read positions, the mean over them, or the count of "
        "positions where the feature fires.",
    )
    feature: Annotated[int, Field(ge=0)] | None = Field(
        None, description="A feature whose activation at every read position is returned."
    )
    steering: Steering = None


class TextSet(StrictBody):
    """One side of a contrast: texts (encoded as /v1/completions prompts) or conversations (chat
    template)."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["texts"]}, {"required": ["conversations"]}]}
    )

    texts: Annotated[list[str], Field(min_length=1)] | None = None
    conversations: Annotated[list[Conversation], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> TextSet:
        one_of(self, "texts", "conversations")
        return self

    @property
    def size(self) -> int:
        """How many texts or conversations."""
        return len(self.texts if self.texts is not None else self.conversations or [])

    @property
    def field(self) -> str:
        """The name of the list it holds."""
        return "texts" if self.texts is not None else "conversations"


class ContrastRequest(StrictBody):
    """POST /api/saes/{id}/contrast: the features that best separate set `a` from set `b`."""

    model: ModelName = None
    a: TextSet
    b: TextSet
    top_k: TopK = 20
    aggregate: Aggregate = Field(
        "max",
        description="Each text's value of a feature: its max, or its mean, over the text's read "
        "positions.",
    )
    steering: Steering = None


# answers ------------------------------------------------------------------------------------------
class SteeringUsed(BaseModel):
    """How the read was steered: none, live, profile, cluster, circuit or features, with what
    named it."""

    kind: str
    params: dict[str, str | int | float] = {}


class TokenRead(BaseModel):
    """A read position and its token."""

    position: int
    token_id: int
    token: str


class InspectFeature(BaseModel):
    """A feature that fired: its max and mean over the read positions, how many positions it
    fired at, where it peaked."""

    index: int
    label: str | None
    max: float
    mean: float
    count: int
    max_position: int


class FeatureValue(BaseModel):
    """A feature's activation at one read position."""

    position: int
    token: str
    value: float


class FeatureTrace(BaseModel):
    """The asked feature's activation at every read position."""

    index: int
    label: str | None
    values: list[FeatureValue]


class InspectResponse(BaseModel):
    """The features that fire on the text, top_k by `sort`, and the asked feature's per-token
    activations."""

    object: Literal["sae.inspect"] = "sae.inspect"
    model: str
    sae_id: str
    layer: int
    sort: Sort
    steered: bool
    steering: SteeringUsed
    prompt_tokens: int
    tokens: list[TokenRead]  # the read positions: every one but the first
    features: list[InspectFeature]
    activations: FeatureTrace | None = None


class ContrastFeature(BaseModel):
    """A feature's separation of the sets: mean per-text value in each, a - b, Cohen's d (null:
    infinite, both sets constant and different), and in how many texts of each it fired."""

    index: int
    label: str | None
    mean_a: float
    mean_b: float
    difference: float
    effect_size: float | None
    fired_a: int
    fired_b: int


class SetRead(BaseModel):
    """What was read of one set: its texts and their tokens."""

    texts: int
    tokens: int


class ContrastResponse(BaseModel):
    """The features that best separate the sets, top_k favouring each, strongest effect first."""

    object: Literal["sae.contrast"] = "sae.contrast"
    model: str
    sae_id: str
    layer: int
    aggregate: Aggregate
    steered: bool
    steering: SteeringUsed
    a: SetRead
    b: SetRead
    favouring_a: list[ContrastFeature]
    favouring_b: list[ContrastFeature]
