"""Turning a validated request into engine rows, and the engine's events into an async stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from millm.engine.constraints import GrammarSpec
from millm.engine.jobs import (
    CallDone,
    EmbeddingsReady,
    Event,
    GenerationJob,
    JobControl,
    JobFailed,
    ProbeVerdict,
    ResidualRead,
    ResidualsRead,
    RowFinished,
    RowSpec,
    ScoresReady,
    TextDelta,
    TokenDrawn,
    Watch,
)
from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.errors import ContextLengthExceeded
from millm.kernel.probes.watches import NO_PROBES, ProbeSet

SEED_SPACE = 2**32


@dataclass(frozen=True)
class GenerationOptions:
    """The sampling-related fields of a chat or text completion, already range-checked."""

    max_tokens: int | None
    n: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    seed: int | None
    logprobs: int | None = None  # each drawn token's log-probability, with this many alternatives


def completion_budget(
    lm: LoadedModel, prompt_tokens: int, max_tokens: int | None, default: int, param: str
) -> int:
    """max_tokens for a prompt: the asked value if it fits the window, else a 400; a default
    shrinks to fit."""
    room = lm.context_length - prompt_tokens
    if max_tokens is not None:
        if max_tokens > room:
            raise ContextLengthExceeded(
                limit=lm.context_length,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                param=param,
            )
        return max_tokens
    if room < 1:
        raise ContextLengthExceeded(
            limit=lm.context_length, prompt_tokens=prompt_tokens, max_tokens=None, param=param
        )
    return min(default, room)


def row_seed(seed: int | None, choice: int) -> int | None:
    """Choice j of a seeded request draws from seed + j, so choice 0 matches the same request
    with n=1."""
    return None if seed is None else (seed + choice) % SEED_SPACE


@dataclass(frozen=True)
class RowFill:
    """What every row of a request carries beside its prompt: the steering edit, the output
    constraint, the residual reads and the watches."""

    edit: ResidualEdit | None = None
    constraint: GrammarSpec | None = None
    reads: tuple[ResidualRead, ...] = ()
    watches: tuple[Watch, ...] = ()


def build_rows(
    lm: LoadedModel,
    prompts: list[list[int]],
    options: GenerationOptions,
    default_max_tokens: int,
    param: str,
    fill: RowFill = RowFill(),
) -> list[RowSpec]:
    """One row per (prompt, choice), prompt-major, each with its own budget and seed, all filled
    alike."""
    rows = []
    for prompt in prompts:
        budget = completion_budget(lm, len(prompt), options.max_tokens, default_max_tokens, param)
        for choice in range(options.n):
            rows.append(
                RowSpec(
                    prompt_ids=tuple(prompt),
                    sampling=options.sampling,
                    max_tokens=budget,
                    stop=options.stop,
                    seed=row_seed(options.seed, choice),
                    edit=fill.edit,
                    constraint=fill.constraint,
                    reads=fill.reads,
                    watches=fill.watches,
                    logprobs=options.logprobs,
                )
            )
    return rows


# a row's monitoring capture, with its active probes' verdicts
Monitored = Callable[[ResidualsRead, Sequence[ProbeVerdict]], None]


# a row's sensing reads, all of them, once the row ended: (row, reads)
Sensed = Callable[[int, Sequence[ResidualsRead]], None]


class JobStream:
    """Bridges the scheduler thread to the event loop: the engine emits, a coroutine iterates.

    Monitoring's capture of a row goes to `on_monitored` instead, with the verdicts of the probes
    named in `monitored_probes` (the active ones), which the engine emits just before it; a row's
    sensing reads (`sensing_reads` of them) go to `on_sensed` together, once all have come."""

    def __init__(
        self,
        rows: list[RowSpec],
        on_monitored: Monitored | None = None,
        monitored_probes: frozenset[str] = frozenset(),
        on_sensed: Sensed | None = None,
        sensing_reads: int = 0,
    ):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._open_rows = len(rows)
        self._on_monitored = on_monitored
        self._monitored_probes = monitored_probes
        self._on_sensed, self._sensing_reads = on_sensed, sensing_reads
        self._sensed: dict[int, list[ResidualsRead]] = {}  # row -> its reads (scheduler thread)
        self._verdicts: dict[
            int, list[ProbeVerdict]
        ] = {}  # row -> active probes' verdicts (scheduler thread only)
        self.job = GenerationJob(rows=rows, emit=self._emit)

    def _emit(self, event: Event) -> None:
        if (
            isinstance(event, ProbeVerdict)
            and self._on_monitored is not None
            and event.name in self._monitored_probes
        ):
            self._verdicts.setdefault(event.row, []).append(event)  # and to the client, below
        if isinstance(event, ResidualsRead) and event.tag == "monitoring":
            if self._on_monitored is not None:  # straight to the monitor's worker, not the client
                self._on_monitored(event, self._verdicts.pop(event.row, []))
            return
        if isinstance(event, ResidualsRead) and event.tag.startswith("sensing:"):
            reads = self._sensed.setdefault(event.row, [])
            reads.append(event)
            if len(reads) == self._sensing_reads and self._on_sensed is not None:
                self._on_sensed(event.row, self._sensed.pop(event.row))
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening anymore
            self.job.cancel()

    def cancel(self) -> None:
        """The client went away: stop the generation and free its slot."""
        self.job.cancel()

    async def events(self):
        """Yield events until every row has finished or the job failed."""
        while self._open_rows > 0:
            event = await self._queue.get()
            yield event
            if isinstance(event, RowFinished):
                self._open_rows -= 1
            elif isinstance(event, JobFailed):
                return


Answer = TypeVar("Answer", EmbeddingsReady, ScoresReady, CallDone)


class OneResult(Generic[Answer]):
    """Bridges a job answered by a single event (embeddings, scores) to the event loop."""

    def __init__(self, answer: type[Answer]) -> None:
        self._answer: type[Answer] = answer
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[Event] = self._loop.create_future()

    def emit(self, event: Event) -> None:
        """Called on the scheduler thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._settle, event)

    def _settle(self, event: Event) -> None:
        if not self._future.done():
            self._future.set_result(event)

    async def wait(self) -> Answer:
        """The event (raises its error if the job failed)."""
        event = await self._future
        if isinstance(event, JobFailed):
            raise event.error
        if not isinstance(event, self._answer):  # a job of this kind emits nothing else
            raise TypeError(f"expected {self._answer.__name__}, got {type(event).__name__}")
        return event


async def answered(
    submit: Callable[[Any], None],
    answer: type[Answer],
    make: Callable[[Callable[[Event], None]], JobControl],
) -> Answer:
    """Submit the job `make(emit)` builds (to the served model's scheduler, or a job's own) and
    await its one answer; the job is cancelled when the caller stops waiting."""
    result = OneResult(answer)
    job = make(result.emit)
    submit(job)
    try:
        return await result.wait()
    finally:
        job.cancel()


@dataclass
class Collected:
    """A non-streamed answer, assembled from the engine's events."""

    texts: list[str]
    finish_reasons: list[str | None]
    completion_tokens: int = 0
    reads: list[ResidualsRead] = field(default_factory=list)  # the request's own SAE read
    row_tokens: list[int] = field(default_factory=list)  # completion tokens of each row
    # prompt tokens each row took from the prefix cache
    row_cached: list[int] = field(default_factory=list)
    choices: int = (
        1  # rows per prompt (n), which share one prefill and so one count of cached tokens
    )
    verdicts: list[ProbeVerdict] = field(default_factory=list)  # every watch's, each row's
    probes: dict | None = (
        None  # the `millm` keys the verdicts make (ProbeSet.block), once collected
    )
    drawn: dict[int, list[TokenDrawn]] = field(default_factory=dict)  # rows asking for logprobs


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
            elif isinstance(event, TokenDrawn):
                result.drawn.setdefault(event.row, []).append(event)
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
