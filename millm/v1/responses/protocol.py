"""POST /v1/responses: the request body, the response object and the stream's events, in OpenAI's
shapes.

The Responses API says the same things as chat completions in other words: `input` items
instead of messages, `instructions` instead of a system message, `max_output_tokens`,
`text.format` instead of `response_format`, flat function tools. millm serves it by saying it
as a chat request (v1/responses/serving.py), so these models only describe the wire.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from millm.errors import FieldNotHonoured
from millm.formats.probe_documents import RequestProbes
from millm.formats.profiles import OwnSteering
from millm.v1.objects import WireModel
from millm.v1.policy.body_fields import OpenBody, Seed, Temperature, TokenCount, TopP
from millm.v1.serving.activations import SaeRead

# OpenAI's limits on metadata: 16 pairs, keys up to 64 characters, values up to 512.
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def new_id(prefix: str) -> str:
    """An OpenAI-style id: `resp_…`, `msg_…`, `fc_…`."""
    return f"{prefix}_{uuid.uuid4().hex}"


class ContentPart(OpenBody):
    """A part of a message's content: text (input_text, or output_text echoed back), a refusal, or a
    kind a text model cannot read (refused when the conversation is built)."""

    type: str
    text: str | None = None
    refusal: str | None = None
    # What an echoed output_text part carries; nothing a model reads.
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(OpenBody):
    """A message: `{"role", "content"}`, with `"type": "message"` or without it."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    # What an echoed output message carries.
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(OpenBody):
    """A function call the model made earlier, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(OpenBody):
    """What a function call returned: a string, or a list of text parts."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class OtherItem(OpenBody):
    """Any other item type (reasoning, item_reference, hosted tools' calls); the conversation
    builder decides."""

    type: str


def _item_kind(value: Any) -> str:
    kind = (
        value.get("type", "message")
        if isinstance(value, dict)
        else getattr(value, "type", "message")
    )
    return kind if kind in ("message", "function_call", "function_call_output") else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


class FunctionTool(OpenBody):
    """A tool as the Responses API sends it: flat, `{"type", "name", "description", "parameters",
    "strict"}`."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(OpenBody):
    """text.format: text, json_object, or json_schema with its name and schema beside the type."""

    type: str
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(OpenBody):
    """text: the output's format (and verbosity, which a local model has no dial for)."""

    format: TextFormat | None = None
    verbosity: str | None = None


# /v1/responses (beyond the spec: issue 22) says chat's fields in other words and is checked as chat
# once translated; these are the Responses API's own output-changing fields it cannot honour, each
# with the values that change nothing.
RESPONSES_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "background": ((False,), "there is no background mode; wait for the answer or stream it"),
    "conversation": (
        (),
        "millm keeps no conversation objects; continue a stored response with previous_response_id",
    ),
    "prompt": (
        (),
        "stored prompt templates live on OpenAI's platform; send instructions and input",
    ),
    "include": (
        ([],),
        "millm adds no optional output (logprobs, reasoning, search results) to a response",
    ),
    "top_logprobs": (
        (0,),
        "log-probabilities are not returned on /v1/responses; use /v1/chat/completions with "
        "logprobs",
    ),
    "truncation": (
        ("disabled",),
        "millm never drops earlier items to fit; a conversation too long is a 400 "
        "context_length_exceeded",
    ),
    "context_management": (([],), "millm compacts no context"),
}


def check_responses_fields(body: dict[str, Any]) -> None:
    """400 field_not_honoured for the first Responses field whose value would change what millm
    cannot change."""
    for field, (neutral, why) in RESPONSES_REFUSED.items():
        value = body.get(field)
        if value is None or any(value == n and type(value) is type(n) for n in neutral):
            continue
        raise FieldNotHonoured(f"{field} cannot be honoured here: {why}", param=field)


class ResponsesRequest(OpenBody):
    """POST /v1/responses."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = False
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None
    # Fields OpenAI defines that change nothing here (named in X-miLLM-Ignored-Fields when sent).
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    # Fields that would change the output and are refused unless neutral (RESPONSES_REFUSED).
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    context_management: list[Any] | None = None
    # millm's extensions, as on chat completions.
    seed: Seed | None = None
    profile: str | None = None
    steering_intensity: float | str | None = None
    steering: OwnSteering | None = None
    return_sae_activations: SaeRead | None = None
    probes: RequestProbes | None = None

    @model_validator(mode="after")
    def _fields_honoured(self):
        check_responses_fields(self.model_dump(exclude_unset=True))
        return self

    @field_validator("input")
    @classmethod
    def _something_to_answer(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value):
        # OpenAI's bounds: a store that keeps metadata must not be a place to park megabytes.
        if value is None:
            return value
        if len(value) > METADATA_PAIRS:
            raise ValueError(f"metadata holds at most {METADATA_PAIRS} pairs, got {len(value)}")
        for key, text in value.items():
            if len(key) > METADATA_KEY:
                raise ValueError(
                    f"metadata key {key[:20]!r}... is longer than {METADATA_KEY} characters"
                )
            if len(text) > METADATA_VALUE:
                raise ValueError(
                    f"metadata value of {key!r} is longer than {METADATA_VALUE} characters"
                )
        return value

    @property
    def stored(self) -> bool:
        """Whether the response is kept for GET and previous_response_id (OpenAI's default: yes)."""
        return self.store is not False


# The response object ------------------------------------------------------------------------------
class OutputText(WireModel):
    """The text of an output message."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(WireModel):
    """An assistant message of the output."""

    type: Literal["message"] = "message"
    id: str
    status: str
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallOutput(WireModel):
    """A function call of the output: the client runs it and sends back a function_call_output
    item."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


OutputItem = OutputMessage | FunctionCallOutput


class InputTokensDetails(WireModel):
    """Prompt tokens taken from the prefix cache."""

    cached_tokens: int


class OutputTokensDetails(WireModel):
    """No reasoning tokens: millm runs no hidden reasoning pass."""

    reasoning_tokens: int = 0


class ResponseUsage(WireModel):
    """Token counts in the Responses API's names."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseError(WireModel):
    """Why a response failed."""

    code: str
    message: str


class IncompleteDetails(WireModel):
    """Why a response stopped early."""

    reason: str


class Response(WireModel):
    """The response object: what was asked (echoed), what came out, and how many tokens it took."""

    omit_when_none = frozenset({"millm"})
    last_keys = ("usage", "millm")
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    status: str
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    background: bool = False
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    service_tier: str = "default"
    store: bool = True
    temperature: float = 1.0
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int = 0
    top_p: float = 1.0
    truncation: str = "disabled"
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None
    millm: dict[str, Any] | None = None  # millm's additions (sae_activations, probes), as on chat


class Event(WireModel):
    """One streamed event: its type, its place in the stream, and its fields."""

    model_config = {"extra": "allow"}
    type: str
    sequence_number: int


class DeletedResponse(WireModel):
    """DELETE /v1/responses/{id}."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class InputItemList(WireModel):
    """GET /v1/responses/{id}/input_items: a page of the conversation the response answered."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
