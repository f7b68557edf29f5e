"""Request bodies of the OpenAI surface: one field per parameter, one validator per cross-field rule.

Models are strict (a string is never a number, `true` is never a seed) and keep unknown
fields, so the field policy can report or refuse them instead of dropping them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from millm.errors import InvalidRequest
from millm.protocol.schema_rules import (
    absent_or_null,
    any_of,
    equals,
    nullable,
    sent,
    when,
)

MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 128

# The rules below as JSON Schema, for the served OpenAPI schema (api/openapi.py puts them there).
TEXT_PART_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
MESSAGE_RULES = [when({"properties": {"role": {"not": {"const": "assistant"}}}}, sent("content"))]
STOP_SCHEMA = nullable(
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {
                "type": "array",
                "maxItems": MAX_STOP_SEQUENCES,
                "items": {"type": "string", "minLength": 1},
            },
        ]
    }
)
# Stricter than _one_token_budget, which also takes the two names with the same value.
BUDGET_RULES = [when(sent("max_tokens"), absent_or_null("max_completion_tokens"))]
CHAT_SCORING = any_of(equals("logprobs", True), sent("allowed_token_ids"))
COMPLETION_SCORING = any_of(
    {"required": ["logprobs"], "properties": {"logprobs": {"not": {"enum": [None, False]}}}},
    sent("allowed_token_ids"),
)
TOP_LOGPROBS_RULES = [when(sent("top_logprobs"), equals("logprobs", True))]
# Token ids are never negative (which ids the vocabulary holds is the model's); a prompt is never empty.
TOKEN_IDS_SCHEMA = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
PROMPT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        TOKEN_IDS_SCHEMA,
        {"type": "array", "minItems": 1, "items": TOKEN_IDS_SCHEMA},
    ]
}

Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
TopN = Annotated[int, Field(ge=0, le=20)]
TokenIds = Annotated[list[int], Field(min_length=1)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
TokenCount = Annotated[int, Field(ge=1)]
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES)]


class OpenBody(BaseModel):
    """Strict parsing that keeps unknown fields for the field policy."""

    model_config = ConfigDict(strict=True, extra="allow")


class TextPart(OpenBody):
    """A content part; only text can be honoured by a text model."""

    type: str
    text: str | None = None


class ToolCallFunction(OpenBody):
    """The function of an earlier tool call: its name and arguments (a JSON string, or an object)."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(OpenBody):
    """A tool call an earlier assistant turn made, sent back with the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(OpenBody):
    """One message of a conversation."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None

    @model_validator(mode="after")
    def _content_required(self):
        # Only an assistant turn (which may carry tool calls instead) can go without content.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self


class StreamOptions(OpenBody):
    """OpenAI's stream_options: include_usage adds a final usage-only chunk."""

    include_usage: bool | None = None


class GenerationFields(OpenBody):
    """How text is sampled and when it stops: the fields every generating body shares (chat, text
    completions, POST /api/compare)."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    stop: str | list[str] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value):
        # OpenAI allows up to 4; an empty string would match everywhere and stop at once.
        stops = [value] if isinstance(value, str) else value
        if stops is None:
            return None
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(
                f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(stops)}"
            )
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty strings")
        return stops

    @model_validator(mode="after")
    def _one_token_budget(self):
        # max_completion_tokens is OpenAI's newer name for max_tokens; two different budgets are ambiguous.
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise InvalidRequest(
                f"max_tokens ({self.max_tokens}) and max_completion_tokens ({self.max_completion_tokens}) "
                "differ; send one of them",
                param="max_completion_tokens",
            )
        return self

    @property
    def token_budget(self) -> int | None:
        """The completion budget under either name."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """Stop strings as a tuple (validated into a list above)."""
        return tuple(self.stop or ())


class SamplingFields(GenerationFields):
    """Fields chat and text completions share."""

    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Choices | None = None
    user: str | None = None
    # miLLM: this request's activations of an attached SAE (checked against the SAEs in service/serving/activations.py)
    return_sae_activations: dict | None = None
    # miLLM: probes watching this request's rows, by name or inline (checked in service/probes/watches.py)
    probes: list[str | dict[str, Any]] | None = None
    # miLLM: this request's own steering, a profile document's steering part (checked in service/serving/prechecks.py)
    steering: dict | None = None


class JsonSchemaFormat(OpenBody):
    """response_format.json_schema: {name, strict, schema, description}."""

    name: str | None = None
    strict: bool | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    description: str | None = None


class ResponseFormat(OpenBody):
    """response_format: text, json_object or json_schema."""

    type: str
    json_schema: JsonSchemaFormat | None = None


# Names in a chat template's namespace that millm fills from the request (or that are options of
# transformers' apply_chat_template rather than template variables).
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "tokenize",
        "return_dict",
        "return_assistant_tokens_mask",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "tokenizer_kwargs",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "raise_exception",
    }
)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions (generation, or chat scoring with logprobs / allowed_token_ids)."""

    messages: list[ChatMessage] = Field(min_length=1)
    extra_messages: list[Annotated[list[ChatMessage], Field(min_length=1)]] | None = None
    profile: str | None = None  # miLLM: a saved steering profile for this request only
    steering_intensity: float | str | None = (
        None  # miLLM: the per-request dial (0-2, off, min, max)
    )
    response_format: ResponseFormat | None = None
    tools: list[Any] | None = (
        None  # checked in service/serving/tools.py (one message per malformed tool)
    )
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: TopN | None = None
    allowed_token_ids: TokenIds | None = None
    return_tokens_as_token_ids: bool | None = None
    # Extra variables for the chat template (Qwen 3's enable_thinking, ...); see RESERVED_TEMPLATE_VARIABLES.
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs_leave_millms_own_alone(cls, value):
        # These are what millm itself hands the template (or apply_chat_template's own options):
        # a request that set them would silently replace the conversation, its tools or its turn.
        taken = [key for key in value or {} if key in RESERVED_TEMPLATE_VARIABLES]
        if taken:
            raise InvalidRequest(
                f"chat_template_kwargs may not set {', '.join(taken)}: millm renders these itself from the request",
                param=f"chat_template_kwargs.{taken[0]}",
            )
        return value

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        # OpenAI's rule: alternatives are only returned alongside the chosen token's log-probability.
        if self.top_logprobs is not None and self.logprobs is not True:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    @property
    def scoring(self) -> bool:
        """Chat scoring: the next token's distribution instead of generated text."""
        return self.logprobs is True or self.allowed_token_ids is not None


class CompletionRequest(SamplingFields):
    """POST /v1/completions: prompt text (or token ids), one choice per prompt."""

    prompt: str | list[str] | list[int] | list[list[int]]
    add_special_tokens: bool | None = None
    logprobs: TopN | bool | None = None
    allowed_token_ids: TokenIds | None = None
    return_tokens_as_token_ids: bool | None = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs_is_a_count(cls, value):
        # On text completions logprobs counts alternatives (0-20); false means none, true means nothing.
        if value is True:
            raise ValueError("on text completions logprobs is the number of alternatives, 0 to 20")
        return None if value is False else value

    @property
    def scoring(self) -> bool:
        """Scoring mode: next-token log-probabilities instead of generated text."""
        return self.logprobs is not None or self.allowed_token_ids is not None

    @field_validator("prompt")
    @classmethod
    def _non_empty_list(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        return value


class EmbeddingRequest(OpenBody):
    """POST /v1/embeddings."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None
