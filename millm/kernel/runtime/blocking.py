"""Engine work for a job's thread: submit to the scheduler and wait, holding a lease per call.

A job (calibration, AutoSteer) runs for minutes; it takes a lease on its model only for the
length of one engine call, so an unload is never held up by it: the unload goes ahead between
two calls, and the next call fails with model_not_loaded, which ends the job with that error.
A model the job loaded beside the served one for itself (an `Engine`) takes its calls directly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from millm.engine.jobs import (
    CallDone,
    CallJob,
    EmbeddingJob,
    EmbeddingsReady,
    Event,
    GenerationJob,
    JobFailed,
    LikelihoodJob,
    LikelihoodsReady,
    Ranking,
    ResidualRead,
    RowFinished,
    RowSpec,
    ScoresReady,
    ScoringJob,
    TextDelta,
)
from millm.engine.residual import ResidualEdit
from millm.errors import ModelNotLoaded

WAIT_SLICE_S = 0.1  # how often a waiting job thread looks at its cancel flag


@dataclass
class Generated:
    """One row's whole answer."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0


@dataclass
class _Collector:
    """Gathers a job's events on the scheduler thread; `done` is set by the terminal event."""

    rows: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    scores: ScoresReady | None = None
    likelihoods: LikelihoodsReady | None = None
    vectors: EmbeddingsReady | None = None
    failed: JobFailed | None = None
    generated: list[Generated] = field(default_factory=list)
    called: CallDone | None = None

    def emit(self, event: Event) -> None:
        if isinstance(event, CallDone):
            self.called = event
            self.done.set()
        elif isinstance(event, JobFailed):
            self.failed = event
            self.done.set()
        elif isinstance(event, ScoresReady):
            self.scores = event
            self.done.set()
        elif isinstance(event, LikelihoodsReady):
            self.likelihoods = event
            self.done.set()
        elif isinstance(event, EmbeddingsReady):
            self.vectors = event
            self.done.set()
        elif isinstance(event, TextDelta):
            self.generated[event.row].text += event.text
        elif isinstance(event, RowFinished):
            row = self.generated[event.row]
            row.finish_reason, row.completion_tokens = event.finish_reason, event.completion_tokens
            if all(g.finish_reason is not None for g in self.generated):
                self.done.set()


class Leases(Protocol):
    """The served model's slot, as a call takes its lease."""

    def lease(self, name: str) -> object | None: ...


class Served(Protocol):
    """The served model's switch (kernel/model/switch.py), as a job's engine calls use it."""

    @property
    def slot(self) -> Leases: ...

    def request_scope(self) -> AbstractContextManager: ...

    def submit(self, job) -> None: ...


class Engine(Protocol):
    """A model a job holds for itself (a model loaded beside the served one): its own scheduler."""

    @property
    def name(self) -> str: ...

    def submit(self, job) -> None: ...


def _run(
    served: Served, model: str | Engine, job, collector: _Collector, cancel: threading.Event | None
) -> None:
    """Submit `job` under a fresh lease on the served `model` (or to the job's own engine) and
    wait for its end (or cancellation)."""
    if not isinstance(model, str):
        model.submit(job)
        _wait(job, collector, cancel)
    else:
        with served.request_scope():
            if served.slot.lease(model) is None:
                raise ModelNotLoaded(
                    f"model {model!r} is no longer loaded (it was unloaded or replaced while the "
                    "job ran)"
                )
            served.submit(job)
            _wait(job, collector, cancel)
    if collector.failed is not None:
        raise collector.failed.error


def _wait(job, collector: _Collector, cancel: threading.Event | None) -> None:
    while not collector.done.wait(WAIT_SLICE_S):
        if cancel is not None and cancel.is_set():
            job.cancel()  # the scheduler drops it at its next look; what it emits after is ignored
            break


def passes_blocking(
    served: Served,
    model: str | Engine,
    prompts: list[list[int]],
    reads: tuple[ResidualRead, ...] = (),
    *,
    ranking: Ranking | None = None,
    edit: ResidualEdit | None = None,
    cancel: threading.Event | None = None,
    reuse_prefix: bool = False,
    reads_only: bool = False,
) -> ScoresReady | None:
    """One forward pass per prompt on the scheduler thread (unsteered unless `edit`), with `reads`
    captured and encoded there; None when `cancel` was set before it finished. `reuse_prefix`:
    prompts may start from the prefix cache (ScoringJob.reuse_prefix); `reads_only`: each pass
    stops after its reads, and no logits come back (ScoringJob.reads_only)."""
    collector = _Collector()
    job = ScoringJob(
        prompts=prompts,
        emit=collector.emit,
        reads=reads,
        ranking=ranking,
        edit=edit,
        reuse_prefix=reuse_prefix,
        reads_only=reads_only,
    )
    _run(served, model, job, collector, cancel)
    return collector.scores


def call_blocking(
    served: Served,
    model: str | Engine,
    call: Callable[[Any], Any],
    *,
    cancel: threading.Event | None = None,
) -> Any:
    """`call(lm)` run on the scheduler thread as one engine job (CallJob: unsteered, unread) and
    what it returned; None when `cancel` was set before it finished."""
    collector = _Collector()
    job = CallJob(call=call, emit=collector.emit)
    _run(served, model, job, collector, cancel)
    return collector.called.value if collector.called is not None else None


def generate_blocking(
    served: Served,
    model: str | Engine,
    rows: list[RowSpec],
    *,
    cancel: threading.Event | None = None,
) -> list[Generated]:
    """Generate `rows` as one engine job (batched together) and return each row's text; rows
    cut short by `cancel` keep what they had."""
    collector = _Collector(rows=len(rows), generated=[Generated() for _ in rows])
    job = GenerationJob(rows=rows, emit=collector.emit)
    _run(served, model, job, collector, cancel)
    return collector.generated


def likelihoods_blocking(
    served: Served,
    model: str,
    sequences: list[list[int]],
    starts: list[int],
    *,
    cancel: threading.Event | None = None,
) -> list[list[float]] | None:
    """Each sequence's continuation (from `starts[i]`) scored token by token by the unsteered
    model; None when `cancel` was set before it finished."""
    collector = _Collector()
    job = LikelihoodJob(sequences=sequences, starts=starts, emit=collector.emit)
    _run(served, model, job, collector, cancel)
    return collector.likelihoods.token_logprobs if collector.likelihoods is not None else None


def embed_blocking(
    served: Served, model: str, prompts: list[list[int]], *, cancel: threading.Event | None = None
) -> np.ndarray | None:
    """Each prompt's mean-pooled final hidden state `[n, d]` (float32), as /v1/embeddings gives
    it; None when `cancel` was set before it finished."""
    collector = _Collector()
    job = EmbeddingJob(prompts=prompts, emit=collector.emit)
    _run(served, model, job, collector, cancel)
    return collector.vectors.vectors.numpy() if collector.vectors is not None else None
