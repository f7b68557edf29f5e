"""What the engine is asked to do and what it reports back; no HTTP, no request models."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Union

from millm.engine.constraints import GrammarSpec
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.errors import MillmError


@dataclass(frozen=True)
class RowSpec:
    """One sequence to generate: a prompt, how to sample, when to stop."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...] = ()
    seed: int | None = None
    edit: ResidualEdit | None = None  # steering: vectors added to the residual stream
    constraint: GrammarSpec | None = None  # structured output: the JSON Schema every token must keep


@dataclass(frozen=True)
class TextDelta:
    """New text for one row (never part of a stop string)."""

    row: int
    text: str


@dataclass(frozen=True)
class RowFinished:
    """A row is done; completion_tokens counts every token it sampled, EOS included."""

    row: int
    finish_reason: str  # "stop" | "length"
    completion_tokens: int


@dataclass(frozen=True)
class JobFailed:
    """The job ended early with this error; no further events follow."""

    error: MillmError


@dataclass(frozen=True)
class EmbeddingsReady:
    """Mean-pooled final hidden states, one row per input, float32 `[N, d]`."""

    vectors: object  # torch.Tensor; typed loosely so this module stays import-light


@dataclass(frozen=True)
class ScoresReady:
    """Next-token logits `[V]` (float32) of each scored prompt, in order."""

    logits: list


Event = Union[TextDelta, RowFinished, JobFailed, EmbeddingsReady, ScoresReady]


@dataclass
class GenerationJob:
    """Rows admitted together; events go to `emit`, which must be thread-safe."""

    rows: list[RowSpec]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop generating as soon as the scheduler sees it (client went away)."""
        self.cancelled.set()


@dataclass
class EmbeddingJob:
    """Inputs to embed (never steered); one EmbeddingsReady event answers it."""

    prompts: list[list[int]]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """The client went away."""
        self.cancelled.set()


@dataclass
class ScoringJob:
    """Prompts to score (one unsteered forward pass each); one ScoresReady event answers it."""

    prompts: list[list[int]]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """The client went away."""
        self.cancelled.set()
