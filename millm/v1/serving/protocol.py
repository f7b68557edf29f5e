"""Request bodies of the OpenAI surface: one field per parameter, one validator per cross-field
rule.

Models are strict (a string is never a number, `true` is never a seed) and keep unknown
fields, so the field policy can report or refuse them instead of dropping them. millm's own
fields (`steering`, `return_sae_activations`, `probes`, `tools`) are typed here too and parsed
with the body, each refused in its own format's words. Over 400 lines because the three bodies
share their fields and rules, and each rule's JSON Schema twin (for what pydantic cannot state
in a schema: a rule across fields) stands beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from millm.engine.jobs import Pooling
from millm.errors import InvalidRequest
from millm.formats.probe_documents import RequestProbes
from millm.formats.profiles import InlineSteering, OwnSteering
from millm.v1.policy.body_fields import (
    Choices,
    OpenBody,
    Penalty,
    RowCount,
    Seed,
    Temperature,
    TokenCount,
    TokenIds,
    TopN,
    TopP,
    listed_inputs,
)
from millm.v1.policy.field_policy import CHAT, COMPLETIONS, EMBEDDINGS, check_fields
from millm.v1.policy.request_rules import (
    check_echo,
    check_scoring,
    check_template_kwargs,
    refuse_multi_row_reads,
)
from millm.v1.policy.response_format import (
    ResponseFormat,
    Structured,
    refuse_combinations,
    structured_of,
)
from millm.v1.policy.schema_rules import (
    absent_or_null,
    equals,
    nullable,
    sent,
    when,
)
from millm.v1.serving.activations import SaeRead
from millm.v1.serving.tools import ChatTools, ToolChoice, ToolPlan, tool_plan

MAX_STOP_SEQUENCES = 4

# The rules below as JSON Schema, for the served OpenAPI schema (server/openapi.py puts them there).
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
# What asks for log-probabilities (scoring mode with one token, or alongside generated tokens:
# v1/policy/request_rules.py says which in the schema).
CHAT_LOGPROBS = equals("logprobs", True)
COMPLETION_LOGPROBS = {
    "required": ["logprobs"],
    "properties": {"logprobs": {"not": {"enum": [None, False]}}},
}
TOP_LOGPROBS_RULES = [when(sent("top_logprobs"), equals("logprobs", True))]
# Token ids are never negative (which ids the vocabulary holds is the model's); a prompt is never
# empty.
TOKEN_IDS_SCHEMA = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
PROMPT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        TOKEN_IDS_SCHEMA,
        {"type": "array", "minItems": 1, "items": TOKEN_IDS_SCHEMA},
    ]
}


class TextPart(OpenBody):
    """A content part; only text can be honoured by a text model."""

    type: str
    text: str | None = None


class ToolCallFunction(OpenBody):
    """The function of an earlier tool call: its name and arguments (a JSON string, or an
    object)."""

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
        # max_completion_tokens is OpenAI's newer name for max_tokens; two different budgets are
        # ambiguous.
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise InvalidRequest(
                f"max_tokens ({self.max_tokens}) and max_completion_tokens "
                f"({self.max_completion_tokens}) differ; send one of them",
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
    # vLLM's: a logprob's token said as "token_id:<id>" (never ambiguous, unlike decoded text)
    return_tokens_as_token_ids: bool | None = None
    # miLLM: this request's activations of an attached SAE (bound to one in
    # v1/serving/activations.py)
    return_sae_activations: SaeRead | None = None
    # miLLM: probes watching this request's rows, by name or inline (found in
    # kernel/probes/watches.py)
    probes: RequestProbes | None = None
    # miLLM: this request's own steering, a profile document's steering part
    steering: OwnSteering | None = Field(
        None, description="miLLM: this request's own steering (not with profile)."
    )
    profile: str | None = None  # miLLM: a saved steering profile for this request only
    steering_intensity: float | str | None = (
        None  # miLLM: the per-request dial (0-2, off, min, max)
    )

    endpoint: ClassVar[str]  # the field policy's column (v1/policy/field_policy.py)

    @model_validator(mode="after")
    def _fields_honoured(self):
        # First of a body's cross-field rules (parent validators run before a subclass's).
        check_fields(
            self.model_dump(exclude_unset=True),
            self.endpoint,
            scoring=self.scoring,
            streaming=bool(self.stream),
        )
        return self

    @model_validator(mode="after")
    def _one_steering(self):
        # Each replaces the steering base for this request, so only one can.
        if self.profile is not None and self.steering is not None:
            raise InvalidRequest(
                "send either profile or steering: each replaces the steering base for this "
                "request, so they cannot be combined",
                param="steering",
            )
        # The original miLLM's inline shape states its strengths as applied: no dial scales them.
        if isinstance(self.steering, InlineSteering) and self.steering_intensity is not None:
            raise InvalidRequest(
                'send either steering_intensity or steering in the {"sae_id", "features"} '
                "shape, whose strengths are applied as sent (the dial scales a profile, or "
                'steering in the {"steering": [...]} shape)',
                param="steering_intensity",
            )
        return self

    if TYPE_CHECKING:  # each endpoint's body says when it asks for scoring mode, and for logprobs

        @property
        def scoring(self) -> bool: ...

        @property
        def drawn_logprobs(self) -> int | None: ...

    @property
    def scoring_temperature(self) -> float:
        """What scoring mode divides the logits by (0: no scaling); OpenAI's default is 1."""
        return 1.0 if self.temperature is None else self.temperature


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions (generation, or chat scoring with logprobs / allowed_token_ids)."""

    endpoint = CHAT

    messages: list[ChatMessage] = Field(min_length=1)
    extra_messages: list[Annotated[list[ChatMessage], Field(min_length=1)]] | None = None
    response_format: ResponseFormat | None = None
    tools: ChatTools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: TopN | None = None
    allowed_token_ids: TokenIds | None = None
    # Extra variables for the chat template (Qwen 3's enable_thinking, ...); see
    # check_template_kwargs.
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs_leave_millms_own_alone(cls, value):
        check_template_kwargs(value)
        return value

    _structured: Structured | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        # OpenAI's rule: alternatives are only returned alongside the chosen token's
        # log-probability.
        if self.top_logprobs is not None and self.logprobs is not True:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    # After the field policy, in the order a client would fix them: the format, then scoring.
    @model_validator(mode="after")
    def _response_format_rules(self):
        self._structured = structured_of(self.response_format)
        if self._structured is not None:
            refuse_combinations(self)
        return self

    # Here, not on SamplingFields: a parent's validators run first, and a client fixes the
    # format before the scoring fields (the order of a text completion's has no format).
    @model_validator(mode="after")
    def _scoring_rules(self):
        if self.scoring:
            check_scoring(self)
        return self

    @model_validator(mode="after")
    def _one_read_row(self):
        refuse_multi_row_reads(self, 1)
        return self

    _tools: ToolPlan | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _tool_rules(self):
        self._tools = tool_plan(self.tools, self.tool_choice, self.parallel_tool_calls)
        return self

    @property
    def scoring(self) -> bool:
        """Chat scoring: the next token's distribution instead of generated text
        (allowed_token_ids, or logprobs with max_tokens 1)."""
        return self.allowed_token_ids is not None or (
            self.logprobs is True and self.token_budget == 1
        )

    @property
    def drawn_logprobs(self) -> int | None:
        """Alternatives to report with each generated token (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs is True and not self.scoring else None

    @property
    def row_count(self) -> RowCount:
        """A row per conversation: `messages` and each of `extra_messages`."""
        return RowCount(1 + len(self.extra_messages or []), "extra_messages", "conversations")

    @property
    def structured(self) -> Structured | None:
        """The output constraint response_format asks for (None for text), checked while parsing."""
        return self._structured

    @property
    def tool_plan(self) -> ToolPlan | None:
        """What the tool fields mean (None when no tools were sent), checked while parsing."""
        return self._tools


class CompletionRequest(SamplingFields):
    """POST /v1/completions: prompt text (or token ids), one choice per prompt."""

    endpoint = COMPLETIONS

    prompt: str | list[str] | list[int] | list[list[int]]
    add_special_tokens: bool | None = None
    # 0 only with echo: the prompt scored, nothing generated (rule: check_echo).
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    echo: bool | None = None  # beyond the spec (issue 34): the prompt's tokens, scored
    logprobs: TopN | bool | None = None
    allowed_token_ids: TokenIds | None = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs_is_a_count(cls, value):
        # On text completions logprobs counts alternatives (0-20); false means none, true means
        # nothing.
        if value is True:
            raise ValueError("on text completions logprobs is the number of alternatives, 0 to 20")
        return None if value is False else value

    @property
    def scoring(self) -> bool:
        """Scoring mode: next-token log-probabilities instead of generated text
        (allowed_token_ids, or logprobs with max_tokens 1; max_tokens 0 with echo)."""
        return (
            self.allowed_token_ids is not None
            or self.token_budget == 0
            or (self.logprobs is not None and self.token_budget == 1)
        )

    @property
    def drawn_logprobs(self) -> int | None:
        """Alternatives to report with each generated token (None: no logprobs)."""
        return self.logprobs if not self.scoring else None

    @property
    def row_count(self) -> RowCount:
        """A row per prompt."""
        return RowCount(len(listed_inputs(self.prompt)), "prompt", "prompts")

    @field_validator("prompt")
    @classmethod
    def _non_empty_list(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        return value

    @model_validator(mode="after")
    def _scoring_rules(self):
        if self.scoring:
            check_scoring(self)
        return self

    @model_validator(mode="after")
    def _echo_rules(self):
        check_echo(self)
        return self

    @model_validator(mode="after")
    def _one_read_row(self):
        refuse_multi_row_reads(self, len(listed_inputs(self.prompt)))
        return self


class EmbeddingRequest(OpenBody):
    """POST /v1/embeddings."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None
    # Beyond OpenAI's (as upstream miLLM): how an input's token states become its vector, and
    # whether it is scaled to length 1.
    pooling: Pooling | None = None
    normalize: bool | None = None

    @field_validator("input")
    @classmethod
    def _nothing_empty(cls, value):
        # An empty input has no token to pool; said before any model is touched.
        if value == "":
            raise InvalidRequest("input must not be empty", param="input")
        if value == []:
            raise InvalidRequest("input must contain at least one string", param="input")
        empty = (
            [i for i, item in enumerate(value) if item in ("", [])]
            if isinstance(value, list)
            else []
        )
        if empty:
            count = f" ({len(empty)} empty inputs)" if len(empty) > 1 else ""
            raise InvalidRequest(
                f"input[{empty[0]}] must not be empty{count}", param=f"input[{empty[0]}]"
            )
        return value

    @property
    def input_count(self) -> int:
        """How many inputs are embedded (a string or one token-id list is one)."""
        return len(listed_inputs(self.input))

    @model_validator(mode="after")
    def _fields_honoured(self):
        check_fields(
            self.model_dump(exclude_unset=True), EMBEDDINGS, scoring=False, streaming=False
        )
        return self
