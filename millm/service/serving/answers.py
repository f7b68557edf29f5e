"""The engine's events as OpenAI bodies: a whole answer collected, or its chunks as they come.

A shape (chat, chat with tools, text completion) says how a row's text becomes choices; the
same loop serves all three. Failures in a stream come out as the error itself (the API frames
it as OpenAI's error object), never as a half-built chunk.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from millm.engine.jobs import JobFailed, ProbeVerdict, ResidualsRead, RowFinished, TextDelta
from millm.errors import MillmError
from millm.protocol.completion_objects import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    CompletionChoice,
    Delta,
    FunctionCall,
    StreamedToolCall,
    ToolCall,
    Usage,
    WireModel,
    now,
)
from millm.service.probes.watches import NO_PROBES, ProbeSet
from millm.service.serving.activations import ActivationRead, activations_block
from millm.service.serving.generation import JobStream
from millm.service.serving.replies import Admitted
from millm.service.serving.tool_answers import CallHoldback, read_answer
from millm.service.serving.tools import ToolPlan


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


@dataclass
class Collected:
    """A non-streamed answer, assembled from the engine's events."""

    texts: list[str]
    finish_reasons: list[str | None]
    completion_tokens: int = 0
    reads: list[ResidualsRead] = field(default_factory=list)  # the request's own SAE read
    row_tokens: list[int] = field(default_factory=list)  # completion tokens of each row
    row_cached: list[int] = field(
        default_factory=list
    )  # prompt tokens each row took from the prefix cache
    choices: int = (
        1  # rows per prompt (n), which share one prefill and so one count of cached tokens
    )
    verdicts: list[ProbeVerdict] = field(default_factory=list)  # every watch's, each row's
    probes: dict | None = (
        None  # the `millm` keys the verdicts make (ProbeSet.block), once collected
    )


def millm_block(
    read: ActivationRead | None, captured: list, unsteered: bool = False, probes: dict | None = None
) -> dict | None:
    """The body's `millm` object: the probes' verdicts and the SAE read (None when there is neither)."""
    block = dict(probes or {})
    if read is not None and captured:
        block["sae_activations"] = activations_block(
            read, captured[0], unsteered=unsteered
        )  # encoded on the scheduler thread
    return block or None


def cached_tokens(by_row: dict[int, int] | list[int], choices: int) -> int:
    """The request's prompt tokens taken from the prefix cache: each prompt's once (its n rows share one prefill)."""
    rows = by_row.items() if isinstance(by_row, dict) else enumerate(by_row)
    return sum(cached for row, cached in rows if row % choices == 0)


async def collect(
    stream: JobStream, rows: int, probes: ProbeSet = NO_PROBES, choices: int = 1
) -> Collected:
    """Run a job to the end; cancelling the awaiting task (the client left) cancels the job."""
    result = Collected(
        texts=[""] * rows,
        finish_reasons=[None] * rows,
        row_tokens=[0] * rows,
        row_cached=[0] * rows,
        choices=choices,
    )
    try:
        async for event in stream.events():
            if isinstance(event, TextDelta):
                result.texts[event.row] += event.text
            elif isinstance(event, RowFinished):
                result.finish_reasons[event.row] = event.finish_reason
                result.completion_tokens += event.completion_tokens
                result.row_tokens[event.row] = event.completion_tokens
                result.row_cached[event.row] = event.cached_tokens
            elif isinstance(event, ResidualsRead):
                result.reads.append(event)
            elif isinstance(event, ProbeVerdict):
                result.verdicts.append(event)
            elif isinstance(event, JobFailed):
                raise event.error
    finally:
        stream.cancel()
    result.probes = await probes.block(result.verdicts)
    return result


class Shape(ABC):
    """How a row's text becomes choices, whole and streamed (a fresh one per request: tools hold text per row)."""

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


class ChatShape(Shape):
    """Chat: a role chunk first, content deltas, a finish chunk; tool calls as OpenAI sends them."""

    def __init__(self, tools: ToolPlan | None = None):
        self.tools = tools
        self.texts: dict[int, str] = {}
        self.holds: dict[int, CallHoldback] = {}

    def whole(self, meta, result, prompt_tokens, read):
        choices = [
            self.choice(i, text, result.finish_reasons[i]) for i, text in enumerate(result.texts)
        ]
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


def tool_call(call: dict) -> ToolCall:
    """An OpenAI tool call as the tools module builds it, typed."""
    return ToolCall(id=call["id"], function=FunctionCall(**call["function"]))


class CompletionShape(Shape):
    """Text completion: text deltas per choice index, then finish chunks."""

    def whole(self, meta, result, prompt_tokens, read):
        choices = [
            CompletionChoice(index=i, text=text, finish_reason=result.finish_reasons[i])
            for i, text in enumerate(result.texts)
        ]
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

    def delta(self, row, text):
        return [CompletionChoice(index=row, text=text, finish_reason=None)]

    def finish(self, row, reason):
        return [CompletionChoice(index=row, text="", finish_reason=reason)]


async def chunks(
    stream: JobStream, rows: int, admitted: Admitted, shape: Shape, meta: Meta
) -> AsyncIterator[WireModel | MillmError]:
    """A job's chunks: opening ones, deltas, one finish chunk per row (the last carries usage), or the error that ended it.

    With stream_options.include_usage, usage instead comes in a final chunk with no choices, as
    OpenAI does. Then the probe-verdict chunk (no choices; `millm.probes`, every row's), when
    probes watched the request; a request's SAE activations come last, in a chunk with no choices.
    """
    prompt_tokens, include_usage, choices = (
        admitted.prompt_tokens,
        admitted.include_usage,
        admitted.choices,
    )
    read, probes = admitted.read, admitted.probes
    finished = completion_tokens = 0
    cached: dict[int, int] = {}
    captured: list[ResidualsRead] = []
    verdicts: list[ProbeVerdict] = []
    try:
        for opening in shape.opening():
            yield shape.chunk(meta, opening)
        async for event in stream.events():
            if isinstance(event, TextDelta):
                for choice in shape.delta(event.row, event.text):
                    yield shape.chunk(meta, [choice])
            elif isinstance(event, RowFinished):
                finished += 1
                completion_tokens += event.completion_tokens
                cached[event.row] = event.cached_tokens
                last = finished == rows and not include_usage
                closing = shape.finish(event.row, event.finish_reason)
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
    finally:
        stream.cancel()
