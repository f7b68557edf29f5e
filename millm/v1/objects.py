"""Response bodies of the OpenAI surface as typed models, in OpenAI's shapes.

OpenAI sends some keys as null (a choice's `logprobs`, `finish_reason` while streaming) and
leaves others out when they have nothing to say (a message's `tool_calls`, a chunk's `usage`,
millm's `millm` object). `omit_when_none` names the second kind per model.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_serializer


def hex_id(prefix: str) -> str:
    """`prefix` and 24 random hex digits: the ids of files (`file-`), batches (`batch_`) and a
    batch's lines (`batch_req_`, `req_`), as OpenAI's look."""
    return prefix + secrets.token_hex(12)


class WireModel(BaseModel):
    """A response body: fields named in `omit_when_none` are left out while None, others are sent
    as null."""

    omit_when_none: ClassVar[frozenset[str]] = frozenset()
    last_keys: ClassVar[tuple[str, ...]] = ()  # sent after every other key, as OpenAI orders them

    @model_serializer(mode="wrap")
    def _omit_nones(self, handler):
        data = handler(self)
        for key in self.omit_when_none:
            if data.get(key, 0) is None:
                del data[key]
        for key in self.last_keys:
            if key in data:
                data[key] = data.pop(key)
        return data


def now() -> int:
    """OpenAI's `created`: whole seconds since the epoch."""
    return int(time.time())


class PromptTokensDetails(WireModel):
    """What OpenAI reports of the prompt's tokens: how many came from the prefix cache."""

    cached_tokens: int


class Usage(WireModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        """Usage with its total; `cached_tokens` of the prompt tokens were reused, not computed."""
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class FunctionCall(WireModel):
    """A called function: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class AssistantToolCall(WireModel):
    """One tool call of an assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class StreamedToolCall(AssistantToolCall):
    """A tool call as a stream delta carries it: with its position among the choice's calls."""

    index: int


class TopLogprob(WireModel):
    """An alternative token of chat logprobs."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    """The chosen token of chat logprobs, with its alternatives."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(WireModel):
    """Chat logprobs: one entry per generated token (scoring generates one)."""

    content: list[TokenLogprob]


class CompletionLogprobs(WireModel):
    """The legacy completions logprobs object."""

    tokens: list[str]
    token_logprobs: list[float | None]  # null for an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class AssistantMessage(WireModel):
    """The message of a chat choice."""

    omit_when_none = frozenset({"tool_calls"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[AssistantToolCall] | None = None


class ChatChoice(WireModel):
    """A whole chat choice."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class Delta(WireModel):
    """What one chat chunk adds to a choice."""

    omit_when_none = frozenset({"role", "content", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[StreamedToolCall] | None = None


class ChunkChoice(WireModel):
    """A choice of a chat chunk."""

    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class CompletionChoice(WireModel):
    """A text-completion choice, whole or as a streamed piece."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class Envelope(WireModel):
    """What every body and chunk of one request repeats: id, object, created, model."""

    omit_when_none = frozenset({"usage", "millm", "system_fingerprint", "millm_steering"})
    last_keys = ("choices", "usage", "millm", "millm_steering")
    id: str
    object: str
    created: int = Field(default_factory=now)
    model: str
    system_fingerprint: str | None = None
    usage: Usage | None = None
    millm: dict[str, Any] | None = None  # millm's additions (sae_activations)
    millm_steering: str | None = None  # a stream's last chunk: X-miLLM-Steering's value


class ChatCompletion(Envelope):
    """A whole chat completion."""

    object: str = "chat.completion"
    choices: list[ChatChoice]


class ChatCompletionChunk(Envelope):
    """One streamed chat chunk."""

    object: str = "chat.completion.chunk"
    choices: list[ChunkChoice]


class Completion(Envelope):
    """A text completion, whole or one streamed chunk (OpenAI names and shapes both alike)."""

    object: str = "text_completion"
    choices: list[CompletionChoice]


class Embedding(WireModel):
    """One input's vector: floats, or base64 of little-endian float32."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(WireModel):
    """Embeddings count only input tokens."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingList(WireModel):
    """The embeddings of every input."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ModelCard(WireModel):
    """OpenAI's model object, plus vLLM's max_model_len while the model is loaded; a steered
    variant's also has vLLM's `parent` (its base, as vLLM lists a LoRA adapter) and a `millm` block
    saying how it is steered."""

    omit_when_none = frozenset({"max_model_len", "parent", "millm"})
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int | None = None
    parent: str | None = None
    millm: dict | None = None


class ModelList(WireModel):
    """The models clients can name."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
