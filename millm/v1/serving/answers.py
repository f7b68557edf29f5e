"""The engine's events as OpenAI bodies: a whole answer collected, or its chunks as they come.

A shape (chat, chat with tools, text completion) says how a row's text becomes choices; the
same loop serves all three. Failures in a stream come out as the error itself (the API frames
it as OpenAI's error object), never as a half-built chunk.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from millm.engine.jobs import (
    JobFailed,
    ProbeVerdict,
    ResidualsRead,
    RowFinished,
    TextDelta,
    TokenDrawn,
)
from millm.errors import MillmError
from millm.v1.objects import (
    AssistantMessage,
    AssistantToolCall,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    FunctionCall,
    StreamedToolCall,
    Usage,
    WireModel,
    now,
)
from millm.v1.serving.activations import ActivationRead, activations_block
from millm.v1.serving.answers_read import CallHoldback, read_answer
from millm.v1.serving.generation import Collected, JobStream
from millm.v1.serving.replies import Admitted
from millm.v1.serving.tools import ToolPlan
from millm.v1.token_logprobs import TokenWords, joined


@dataclass(frozen=True)
class Meta:
    """What every body and chunk of one request repeats."""

    id: str
    model: str
    fingerprint: str
    created: int = field(default_factory=now)

    @classmethod
    def new(cls, prefix: str, model: str, fingerprint: str) -> Meta:
        """A fresh response id (`chatcmpl-…`, `cmpl-…`) for `model`."""
        return cls(f"{prefix}-{uuid.uuid4().hex}", model, fingerprint)


def millm_block(
    read: ActivationRead | None, captured: list, unsteered: bool = False, probes: dict | None = None
) -> dict | None:
    """The body's `millm` object: the probes' verdicts and the SAE read (None when there is
    neither)."""
    block = dict(probes or {})
    if read is not None and captured:
        # encoded on the scheduler thread
        block["sae_activations"] = activations_block(read, captured[0], unsteered=unsteered)
    return block or None


def cached_tokens(by_row: dict[int, int] | list[int], choices: int) -> int:
    """The request's prompt tokens taken from the prefix cache: each prompt's once (its n rows
    share one prefill)."""
    rows = by_row.items() if isinstance(by_row, dict) else enumerate(by_row)
    return sum(cached for row, cached in rows if row % choices == 0)


class Shape(ABC):
    """How a row's text becomes choices, whole and streamed (a fresh one per request: tools hold
    text per row)."""

    @abstractmethod
    def whole(
        self, meta: Meta, result: Collected, prompt_tokens: int, read: ActivationRead | None
    ) -> WireModel:
        """The whole body."""

    @abstractmethod
    def chunk(self, meta: Meta, choices: list, **extra) -> WireModel:
        """One streamed chunk."""

    def opening(self) -> list[list]:
        """Chunks sent before the first delta."""
        return []

    @abstractmethod
    def delta(self, row: int, text: str) -> list:
        """The choices to send for new text of a row (none while text is held back)."""

    @abstractmethod
    def finish(self, row: int, reason: str | None) -> list:
        """The choices that close a row; the last carries the finish reason."""

    def with_logprobs(self, choice, row: int, drawn: list[TokenDrawn]):
        """A streamed choice carrying the log-probabilities of the tokens drawn since the last."""
        return choice


class ChatShape(Shape):
    """Chat: a role chunk first, content deltas, a finish chunk; tool calls as OpenAI sends them."""

    def __init__(self, tools: ToolPlan | None = None, words: TokenWords | None = None):
        self.tools = tools
        self.words = words  # when the request asked for logprobs while generating
        self.texts: dict[int, str] = {}
        self.holds: dict[int, CallHoldback] = {}

    def whole(self, meta, result, prompt_tokens, read):
        choices = [
            self.choice(i, text, result.finish_reasons[i]) for i, text in enumerate(result.texts)
        ]
        if self.words is not None:
            for choice in choices:
                choice.logprobs = self.words.chat(result.drawn.get(choice.index, []))
        return ChatCompletion(
            id=meta.id,
            created=meta.created,
            model=meta.model,
            system_fingerprint=meta.fingerprint,
            choices=choices,
            usage=Usage.of(
                prompt_tokens,
                result.completion_tokens,
                cached_tokens(result.row_cached, result.choices),
            ),
            millm=millm_block(read, result.reads, probes=result.probes),
        )

    def choice(self, index: int, text: str, reason: str | None) -> ChatChoice:
        """A whole chat choice; with tools, its text read for calls."""
        if self.tools is None:
            return ChatChoice(
                index=index, message=AssistantMessage(content=text), finish_reason=reason
            )
        answer = read_answer(self.tools, text, reason, index)
        calls = [tool_call(call) for call in answer.calls] or None
        return ChatChoice(
            index=index,
            message=AssistantMessage(content=answer.content, tool_calls=calls),
            finish_reason=answer.finish_reason(reason),
        )

    def chunk(self, meta, choices, **extra):
        return ChatCompletionChunk(
            id=meta.id, created=meta.created, model=meta.model, choices=choices, **extra
        )

    def opening(self):
        return [[ChunkChoice(index=0, delta=Delta(role="assistant", content=""))]]

    def with_logprobs(self, choice, row, drawn):
        if self.words is not None:
            choice.logprobs = self.words.chat(drawn)
        return choice

    def delta(self, row, text):
        tools = self.tools
        if tools is None:
            return [content(row, text)]
        # With tools: text streams until a call may begin (auto), or not at all (a forced call).
        self.texts[row] = self.texts.get(row, "") + text
        if tools.constrained:
            return []
        passed = self.holds.setdefault(row, CallHoldback()).push(text) if tools.offered else text
        return [content(row, passed)] if passed else []

    def finish(self, row, reason):
        if self.tools is None:
            return [ChunkChoice(index=row, delta=Delta(), finish_reason=reason)]
        answer = read_answer(self.tools, self.texts.pop(row, ""), reason, row)
        held = self.holds.pop(row, CallHoldback()).flush()
        choices = []
        if not answer.calls:
            # What has not been streamed yet: the held tail (auto), or a cut forced call's text.
            rest = (answer.content or "") if self.tools.constrained else held
            if rest:
                choices.append(content(row, rest))
        for k, call in enumerate(answer.calls):
            piece = StreamedToolCall(index=k, **tool_call(call).model_dump())
            choices.append(ChunkChoice(index=row, delta=Delta(tool_calls=[piece])))
        return [
            *choices,
            ChunkChoice(index=row, delta=Delta(), finish_reason=answer.finish_reason(reason)),
        ]


def content(row: int, text: str) -> ChunkChoice:
    """A chat content delta."""
    return ChunkChoice(index=row, delta=Delta(content=text))


def tool_call(call: dict) -> AssistantToolCall:
    """An OpenAI tool call as the tools module builds it, typed."""
    return AssistantToolCall(id=call["id"], function=FunctionCall(**call["function"]))


@dataclass(frozen=True)
class Echo:
    """What echo puts before a prompt's completion: its text and, with logprobs, its tokens
    scored."""

    text: str
    logprobs: CompletionLogprobs | None = None


class CompletionShape(Shape):
    """Text completion: text deltas per choice index, then finish chunks; with echo, each row's
    prompt first; with logprobs, the legacy object, offsets counting from the prompt's start."""

    def __init__(
        self,
        prompt_texts: list[str] | None = None,
        n: int = 1,
        words: TokenWords | None = None,
        echoes: list[Echo] | None = None,
    ):
        self.prompt_texts, self.n, self.words, self.echoes = prompt_texts or [], n, words, echoes
        self.offsets: dict[int, int] = {}  # row -> where its next streamed token's text begins

    def _start(self, row: int) -> int:
        return len(self.prompt_texts[row // self.n]) if self.prompt_texts else 0

    def whole(self, meta, result, prompt_tokens, read):
        choices = []
        for i, text in enumerate(result.texts):
            echo = self.echoes[i // self.n] if self.echoes else Echo("")
            logprobs = None
            if self.words is not None:
                logprobs = self.words.legacy(result.drawn.get(i, []), self._start(i))
                if echo.logprobs is not None:
                    logprobs = joined(echo.logprobs, logprobs)
            choices.append(
                CompletionChoice(
                    index=i,
                    text=echo.text + text,
                    logprobs=logprobs,
                    finish_reason=result.finish_reasons[i],
                )
            )
        return Completion(
            id=meta.id,
            created=meta.created,
            model=meta.model,
            system_fingerprint=meta.fingerprint,
            choices=choices,
            usage=Usage.of(
                prompt_tokens,
                result.completion_tokens,
                cached_tokens(result.row_cached, result.choices),
            ),
            millm=millm_block(read, result.reads, probes=result.probes),
        )

    def chunk(self, meta, choices, **extra):
        return Completion(
            id=meta.id, created=meta.created, model=meta.model, choices=choices, **extra
        )

    def opening(self):
        if not self.echoes:
            return []
        return [
            [
                CompletionChoice(
                    index=row,
                    text=self.echoes[row // self.n].text,
                    logprobs=self.echoes[row // self.n].logprobs if self.words else None,
                    finish_reason=None,
                )
            ]
            for row in range(len(self.echoes) * self.n)
        ]

    def delta(self, row, text):
        return [CompletionChoice(index=row, text=text, finish_reason=None)]

    def finish(self, row, reason):
        return [CompletionChoice(index=row, text="", finish_reason=reason)]

    def with_logprobs(self, choice, row, drawn):
        if self.words is None:
            return choice
        start = self.offsets.get(row, self._start(row))
        choice.logprobs = self.words.legacy(drawn, start)
        self.offsets[row] = start + self.words.text_length(drawn)
        return choice


async def chunks(
    stream: JobStream,
    rows: int,
    admitted: Admitted,
    shape: Shape,
    meta: Meta,
    steering: Callable[[], Awaitable[str]] | None = None,
) -> AsyncIterator[WireModel | MillmError]:
    """A job's chunks: opening ones, deltas, one finish chunk per row (the last carries usage), or
    the error that ended it.

    With stream_options.include_usage, usage instead comes in a final chunk with no choices, as
    OpenAI does. Then the probe-verdict chunk (no choices; `millm.probes`, every row's), when
    probes watched the request, and a request's SAE activations, in a chunk with no choices. The
    last chunk (`created` 0, no choices) says what steered the request in `millm_steering`:
    X-miLLM-Steering's value, which a stream sends here, once it is known, rather than as a header.
    """
    prompt_tokens, include_usage, choices = (
        admitted.prompt_tokens,
        admitted.include_usage,
        admitted.choices,
    )
    read, probes = admitted.read, admitted.probes
    finished = completion_tokens = 0
    cached: dict[int, int] = {}
    pending: dict[int, list[TokenDrawn]] = {}  # drawn tokens whose text is not out yet, by row
    captured: list[ResidualsRead] = []
    verdicts: list[ProbeVerdict] = []
    try:
        for opening in shape.opening():
            yield shape.chunk(meta, opening)
        async for event in stream.events():
            if isinstance(event, TokenDrawn):
                pending.setdefault(event.row, []).append(event)
            elif isinstance(event, TextDelta):
                sent = shape.delta(event.row, event.text)
                if sent and event.row in pending:  # held text keeps its tokens for later
                    sent[0] = shape.with_logprobs(sent[0], event.row, pending.pop(event.row))
                for choice in sent:
                    yield shape.chunk(meta, [choice])
            elif isinstance(event, RowFinished):
                finished += 1
                completion_tokens += event.completion_tokens
                cached[event.row] = event.cached_tokens
                last = finished == rows and not include_usage
                closing = shape.finish(event.row, event.finish_reason)
                if event.row in pending:
                    closing[0] = shape.with_logprobs(closing[0], event.row, pending.pop(event.row))
                for choice in closing[:-1]:
                    yield shape.chunk(meta, [choice])
                yield shape.chunk(
                    meta,
                    [closing[-1]],
                    usage=Usage.of(prompt_tokens, completion_tokens, cached_tokens(cached, choices))
                    if last
                    else None,
                )
            elif isinstance(event, ResidualsRead):
                captured.append(event)
            elif isinstance(event, ProbeVerdict):
                verdicts.append(event)
            elif isinstance(event, JobFailed):
                yield event.error
                return
        if include_usage:
            yield shape.chunk(
                meta,
                [],
                usage=Usage.of(prompt_tokens, completion_tokens, cached_tokens(cached, choices)),
            )
        watched = await probes.block(verdicts)
        if watched is not None:
            yield shape.chunk(meta, [], millm=watched)
        block = millm_block(read, captured)
        if block is not None:
            yield shape.chunk(meta, [], millm=block)
        if steering is not None:
            # created 0: the original miLLM's last chunk, which a client tells by that alone too
            yield shape.chunk(replace(meta, created=0), [], millm_steering=await steering())
    finally:
        stream.cancel()
