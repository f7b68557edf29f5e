"""The bodies the `goodfire` SDK (0.3.5) sends and the answers it reads, as it shapes them.

Bodies refuse unknown keys: a field the SDK did not send would be one millm does not honour. A
message is `{"role", "content"}` and is checked by millm's own chat rules when the request is
made.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from millm.v1.objects import WireModel
from millm.v1.policy.body_fields import StrictBody

Message = dict[str, Any]
Conversation = Annotated[list[Message], Field(min_length=1)]


class FeatureIn(StrictBody):
    """A feature as the SDK sends it back (`Feature.json()`)."""

    uuid: str
    label: str | None = None
    index_in_sae: int
    max_activation_strength: float | None = None


class FeatureGroupIn(StrictBody):
    """`FeatureGroup.json()`."""

    features: list[FeatureIn]


class InterventionIn(StrictBody):
    """One edit of a controller: `nudge` (add), `pin` (hold) or `mul`, on a feature group."""

    mode: str
    features: FeatureGroupIn
    value: float


class ConditionalIn(StrictBody):
    """`feature > level`, as `Conditional.json()` writes it."""

    left_hand: FeatureGroupIn
    right_hand: float | FeatureIn
    operator: str


class ConditionalGroupIn(StrictBody):
    """Conditions joined by AND or OR."""

    conditionals: list[ConditionalIn]
    operator: str = "AND"


class ScopeIn(StrictBody):
    """A `set_when` (its controller's edits apply once the condition holds) or an `abort_when`
    (`event_name`: the SDK's handler that raises when the server reports the event)."""

    conditionals: ConditionalGroupIn
    controller: ControllerIn
    is_active: bool = False
    event_name: str | None = None


class ControllerIn(StrictBody):
    """A variant's edits and scopes (`Variant.controller.json()`)."""

    interventions: list[InterventionIn] = []
    scopes: list[ScopeIn] = []
    name: str | None = None
    nonzero_strength_threshold: float | None = None
    min_nudge_entropy: float | None = None
    max_nudge_entropy: float | None = None


class EmberChatRequest(StrictBody):
    """POST chat/completions."""

    messages: Conversation
    model: str
    stream: bool = False
    max_completion_tokens: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    controller: ControllerIn | None = None


class LogitsBody(StrictBody):
    """POST chat-attribution/compute-logits: the next token's logits after a conversation."""

    messages: Conversation
    model: str
    controller: ControllerIn | None = None
    top_k: int | None = 10
    filter_vocabulary: list[str] | None = None


class FeaturesBody(StrictBody):
    """POST chat-attribution/compute-features: features at every token of a conversation."""

    messages: Conversation
    model: str
    controller: ControllerIn | None = None
    aggregate_by: Literal["count", "mean", "max", "sum"] = "count"  # the SDK aggregates itself
    include_feature_indexes: list[int] | None = None


class TokenizeBody(StrictBody):
    """POST chat/tokenize."""

    messages: Conversation
    model: str


class ContrastBody(StrictBody):
    """POST chat-attribution/contrast: two sets of conversations, paired."""

    dataset_1: list[Conversation]
    dataset_2: list[Conversation]
    k_to_add: int = 5
    k_to_remove: int = 5
    model: str


class RerankBody(StrictBody):
    """POST features/rerank: features re-ranked by a query."""

    query: str
    top_k: int = 10
    model: str
    feature_ids: list[str]


class LookupBody(StrictBody):
    """POST features/lookup: features by index."""

    indices: list[int]
    model: str


class NeighborsBody(StrictBody):
    """POST attributions/neighbors: features near one or a group (its centroid)."""

    feature_indices: Annotated[list[int], Field(min_length=1)]
    model: str
    top_k: int = 10


class SpecificationBody(StrictBody):
    """POST features/auto-edits and features/auto-conditional: a goal in words."""

    specification: Annotated[str, Field(min_length=1)]
    model: str


class DatasetBody(StrictBody):
    """POST attributions/generate-contrastive-dataset."""

    specification: str


class AttributionBody(StrictBody):
    """POST attributions/compute-logit-attribution: what drives the token at `startIndex`."""

    messages: Conversation
    model: str
    startIndex: int
    endIndex: int


# answers ------------------------------------------------------------------------------------------
class FeatureOut(WireModel):
    """A feature in Ember's answers: its id, label and index (and, from a search, relevance)."""

    omit_when_none = frozenset({"relevance"})  # the SDK reads a null relevance as an error

    id: str
    label: str
    index_in_sae: int
    relevance: float | None = None


class FeatureList(BaseModel):
    """`{"features": [...]}`: search, rerank and the features route."""

    features: list[FeatureOut]


class LookupFeature(BaseModel):
    """A feature as features/lookup answers it (keyed `uuid` there)."""

    uuid: str
    label: str
    index_in_sae: int


class LookupList(BaseModel):
    """features/lookup's answer."""

    features: list[LookupFeature]


class NeighborList(BaseModel):
    """attributions/neighbors' answer."""

    neighbors: list[FeatureOut]


class ContrastAnswer(BaseModel):
    """chat-attribution/contrast's answer: the features favouring each set."""

    dataset_1_features: list[FeatureOut]
    dataset_2_features: list[FeatureOut]


class Activation(BaseModel):
    """A feature's activation at a token, in Ember's units."""

    id: str
    index_in_sae: int
    activation_strength: float


class TokenFeatures(BaseModel):
    """One token of a conversation and the features active there, strongest first."""

    token: str
    attributions: list[Activation]


class FeaturesAnswer(BaseModel):
    """chat-attribution/compute-features' answer."""

    tokens: list[TokenFeatures]


class TokenText(BaseModel):
    """A token of chat/tokenize's answer."""

    value: str


class TokenList(BaseModel):
    """chat/tokenize's answer."""

    tokens: list[TokenText]


class LogitsAnswer(BaseModel):
    """chat-attribution/compute-logits' answer."""

    logits: dict[str, float]


class ChatMessageOut(WireModel):
    """The answer's message."""

    role: Literal["assistant"] = "assistant"
    content: str


class EmberChoice(WireModel):
    """The answer's one choice."""

    index: int = 0
    message: ChatMessageOut
    finish_reason: str | None


class ChatAnswer(WireModel):
    """chat/completions' answer (the SDK's ChatCompletion): OpenAI's, with the events that fired."""

    id: str
    object: str = "chat.completion"
    created: int | None
    model: str
    system_fingerprint: str
    gf_event_names: list[str] | None = None
    choices: list[EmberChoice]


class EmberDelta(WireModel):
    """A streamed chunk's text."""

    role: str = "assistant"
    content: str


class StreamChoice(WireModel):
    """A streamed chunk's one choice; `gf_token_index` counts chunks (the SDK drops repeats)."""

    index: int = 0
    delta: EmberDelta
    gf_token_index: int
    finish_reason: str | None = None


class ChatChunk(WireModel):
    """One streamed chunk (the SDK's StreamingChatCompletionChunk)."""

    object: str = "chat.completion.chunk"
    id: str
    created: int | None
    model: str
    system_fingerprint: str
    gf_event_names: list[str] | None = None
    choices: list[StreamChoice]


class AutoEdits(BaseModel):
    """features/auto-edits' answer: [feature, value] pairs (none when AutoSteer found no setting
    that beats the unsteered model), and the AutoSteer job whose result holds the evidence."""

    edits: list[tuple[FeatureOut, float]]
    job: str


class Attributed(BaseModel):
    """A feature that drives the target token: its effect, and where it is active."""

    id: str
    value: float
    tokens: list[dict[str, float]]


class AttributionAnswer(BaseModel):
    """attributions/compute-logit-attribution's answer."""

    to_ablate: list[Attributed]
    num_input_tokens: int


ScopeIn.model_rebuild()
