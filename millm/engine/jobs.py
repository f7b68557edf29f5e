"""What the engine is asked to do and what it reports back; no HTTP, no request models."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from millm.engine.constraints import GrammarSpec
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.errors import MillmError

if TYPE_CHECKING:
    import torch

# What a watch does when it fires: nothing but report, steer the row from the next position, or end
# it.
WatchAction = Literal["report", "steer", "abort"]
# Which positions a read keeps: these words, or an absolute (start, end) range.
PositionWord = Literal["last", "prompt", "completion", "all"]


@dataclass(frozen=True)
class ResidualRead:
    """Residual vectors to keep for one row at one point: which positions, and whether before or
    after the point's additions (a request's own SAE read, or monitoring's)."""

    point: int  # after this block (-1: before block 0; mlp_input(L): block L's MLP input)
    after_edit: bool  # post_steering: after this point's steering delta
    positions: PositionWord | tuple[int, int]  # a word, or (start, end)
    tag: str  # who asked: "activations" or "monitoring"
    # Turns the captured vectors `[n, d]` into what the asker wants (an SAE encode). It runs on
    # the scheduler thread because torch work on any other live thread slows every decode step
    # (an idle OpenMP pool of another thread slows decoding; docs/engine.md). What it returns
    # is the asker's own business, hence Any.
    encode: Callable[[torch.Tensor], Any] | None = field(default=None, compare=False)

    def first_position(self, prompt_length: int) -> int:
        """The first position this read wants (a prefix cache may only skip the ones before it)."""
        spec = self.positions
        if spec == "all" or spec == "prompt":
            return 0
        if spec == "completion":
            return prompt_length
        if spec == "last":
            return prompt_length - 1
        return spec[0]


@dataclass(frozen=True)
class Watch:
    """A probe over one row: a score per position of the residual at `point` BEFORE that point's
    edits."""

    name: str
    point: int
    # `[n, d]` float32 (on the model's device) -> `[n]` float32; runs on the scheduler thread.
    score: Callable[[torch.Tensor], torch.Tensor] = field(compare=False)
    threshold: float  # fires at positions where score >= threshold
    action: WatchAction = "report"
    edit: ResidualEdit | None = None  # action "steer": what is added once it fires
    tokens: int | None = None  # action "steer": for this many positions (None: the rest of the row)
    # Positions from the row's start that are never scored: 1 leaves out the attention sink at
    # position 0, whose residual (tens of times the others' norm) makes a probe's score meaningless
    # there.
    skip: int = 0

    def __post_init__(self) -> None:
        if self.action not in ("report", "steer", "abort"):
            raise ValueError(f"unknown watch action {self.action!r}")
        if (self.action == "steer") != (self.edit is not None):
            raise ValueError("a watch carries an edit exactly when its action is steer")
        if self.tokens is not None and (self.action != "steer" or self.tokens < 1):
            raise ValueError("tokens is a positive count, and only for a steer watch")


@dataclass(frozen=True)
class RowSpec:
    """One sequence to generate: a prompt, how to sample, when to stop."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...] = ()
    seed: int | None = None
    edit: ResidualEdit | None = None  # steering: vectors added to the residual stream
    constraint: GrammarSpec | None = (
        None  # structured output: the JSON Schema every token must keep
    )
    reads: tuple[ResidualRead, ...] = ()  # residuals to capture (SAE activations, monitoring)
    watches: tuple[
        Watch, ...
    ] = ()  # probes scored at every position fed, which may steer or end the row
    logprobs: int | None = (
        None  # report each drawn token's log-probability, with this many alternatives
    )


@dataclass(frozen=True)
class TextDelta:
    """New text for one row (never part of a stop string)."""

    row: int
    text: str


@dataclass(frozen=True)
class TokenDrawn:
    """A row's drawn token (EOS excluded) with its log-probability and the most probable
    alternatives, for rows that ask (RowSpec.logprobs); it comes before the step's TextDelta."""

    row: int
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class RowFinished:
    """A row is done; completion_tokens counts every token it sampled, EOS included."""

    row: int
    finish_reason: str  # "stop" | "length" | "content_filter" (an abort watch fired)
    completion_tokens: int
    cached_tokens: int = 0  # prompt positions taken from the prefix cache instead of computed


@dataclass(frozen=True)
class ResidualsRead:
    """What one ResidualRead captured for a row: positions read (absolute over prompt then
    generated tokens), the token at each, and the residual vectors `[n, d]` (float32, CPU)."""

    row: int
    tag: str
    positions: tuple[int, ...]
    token_ids: tuple[int, ...]
    residuals: torch.Tensor
    encoded: Any = None  # the read's `encode` of the residuals, when it has one


@dataclass(frozen=True)
class ProbeVerdict:
    """What one watch saw over a row, emitted for every watch when the row ends (before its
    ResidualsRead and RowFinished events); positions are absolute over prompt then generated
    tokens."""

    row: int
    name: str
    action: str  # report | steer | abort
    fired: bool
    first_position: int | None  # where it first fired
    peak: float | None  # the largest score seen, and where
    peak_position: int | None
    positions: tuple[int, ...]  # every position where it fired (the first 256)
    token_ids: tuple[int, ...]  # the token at each of those positions
    # steer: the first position steered; abort: the position that ended the row
    acted_at: int | None


@dataclass(frozen=True)
class JobFailed:
    """The job ended early with this error; no further events follow."""

    error: MillmError


# How an input's token states become its one vector (engine/embed.py).
Pooling = Literal["mean", "last", "cls"]


@dataclass(frozen=True)
class EmbeddingsReady:
    """Pooled final hidden states, one row per input, float32 `[N, d]`."""

    vectors: torch.Tensor


# Whether the scoring jobs this task makes may be packed (a batch with `pack` sets it per line).
pack_scoring: ContextVar[bool] = ContextVar("pack_scoring", default=False)


@dataclass(frozen=True)
class ScoresReady:
    """Next-token logits `[V]` (float32) of each scored prompt, in order (none for a reads-only
    job), and any residual reads."""

    logits: list
    reads: list = field(default_factory=list)  # ResidualsRead, row = prompt index
    # Scored of each prompt, when the job asked for a ranking
    scored: list = field(default_factory=list)
    echoed: list = field(default_factory=list)  # Echoed of each prompt, when the job asked for echo


@dataclass(frozen=True)
class Ranking:
    """How a scoring job ranks a prompt's next token: over `allowed` ids (None: the whole
    vocabulary), logits divided by `temperature` (0: not scaled), the first `top` kept (None:
    all)."""

    allowed: tuple[int, ...] | None
    temperature: float
    top: int | None = None


@dataclass(frozen=True)
class LikelihoodsReady:
    """The log-probability of each continuation token of each sequence, under the unsteered
    model."""

    token_logprobs: list[list[float]]


@dataclass(frozen=True)
class CallDone:
    """What a CallJob's function returned."""

    value: Any


Event = (
    TextDelta
    | TokenDrawn
    | RowFinished
    | ProbeVerdict
    | ResidualsRead
    | JobFailed
    | EmbeddingsReady
    | ScoresReady
    | LikelihoodsReady
    | CallDone
)


class GuardedEmit:
    """A job's `emit`: its sink, until the job fails, then nothing. It holds no reference back to
    the job, so a finished job (its prompts, reads and a call's tensors) is freed as soon as the
    last holder lets go: a bound method of the job kept on the job would make every job a
    reference cycle, freed only by the cycle collector's rare full passes (a transcoder set's
    training held several GiB of finished steps that way)."""

    __slots__ = ("sink", "lock", "failed")

    def __init__(self, sink: Callable[[Event], None]):
        self.sink, self.lock, self.failed = sink, threading.Lock(), False

    def __call__(self, event: Event) -> None:
        with self.lock:
            if not self.failed:
                self.sink(event)


class JobControl:
    """What every job shares: cancellation, and a terminal failure after which nothing is
    emitted."""

    # Fields of every job dataclass below (declared here so the methods can use them).
    emit: Callable[[Event], None]
    cancelled: threading.Event

    def __post_init__(self) -> None:
        self._guard = GuardedEmit(self.emit)
        self.emit = self._guard
        # A batch's line (set by the scheduler when admitted): it waits behind interactive work.
        self.background = False

    def cancel(self) -> None:
        """Stop working on this job as soon as the scheduler sees it (the client went away)."""
        self.cancelled.set()

    def fail(self, error: MillmError) -> None:
        """End the job with `error`: one JobFailed event, nothing after it."""
        self.cancelled.set()
        guard = self._guard
        with guard.lock:
            if guard.failed:
                return
            guard.failed = True
            guard.sink(JobFailed(error))


@dataclass(eq=False)  # identity: the scheduler keys running jobs by them
class GenerationJob(JobControl):
    """Rows admitted together; events go to `emit`, which must be thread-safe.

    `serial` keeps the job out of a continuous batch: its rows run in their own forward passes
    (a seeded request's promise is per request, and batch composition changes the arithmetic).
    """

    rows: list[RowSpec]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    serial: bool = False


@dataclass(eq=False)  # identity: the scheduler keys running jobs by them
class EmbeddingJob(JobControl):
    """Inputs to embed (never steered), pooled as `pooling` says; one EmbeddingsReady event answers
    it."""

    prompts: list[list[int]]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    pooling: Pooling = "mean"


@dataclass(eq=False)  # identity: the scheduler keys running jobs by them
class ScoringJob(JobControl):
    """Prompts to score (one forward pass each, unsteered unless `edit`); one ScoresReady event
    answers it."""

    prompts: list[list[int]]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    reads: tuple[ResidualRead, ...] = ()  # residuals to capture over each prompt
    ranking: Ranking | None = None  # rank each prompt's candidates here, on the scheduler thread
    # Discovery reads may ask for a steered pass (inspect with a plan); scoring proper never does.
    edit: ResidualEdit | None = None
    # Also score each prompt's own tokens (echo), with the ranking's `top` alternatives at each.
    echo: bool = False
    # Prompts may start from what the prefix cache holds and leave their blocks in it: for many
    # prompts sharing a long start (a scorer's few-shot chat). Unsteered, no reads, no echo only.
    # In bf16 a restored prefix gives logits a few last bits off a whole pass's.
    reuse_prefix: bool = False
    # Only the reads are wanted (a discovery read keeps its summaries): each pass stops once every
    # read point has been passed, so the layers after the SAE's never run; no logits come back.
    reads_only: bool = False
    # May share one padded pass with other such jobs waiting (a batch's scoring lines with `pack`):
    # faster, but its logits then differ from a pass alone in the last bits.
    pack: bool = False

    @property
    def packable(self) -> bool:
        """Whether it may share a pass: packing asked for, plain next-token scoring only."""
        plain = not self.reads and self.edit is None and not self.echo and not self.reuse_prefix
        return self.pack and plain and not self.reads_only


@dataclass(eq=False)  # identity: the scheduler keys running jobs by them
class LikelihoodJob(JobControl):
    """Sequences whose tokens from `starts[i]` on are scored given what precedes them (one
    unsteered forward pass each); one LikelihoodsReady event answers it."""

    sequences: list[list[int]]
    starts: list[int]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)  # identity: the scheduler keys running jobs by them
class CallJob(JobControl):
    """One step of longer model work that is neither generation nor a plain pass (an attribution
    graph's backward passes): `call(lm)` runs on the scheduler thread with no steering installed,
    and one CallDone event carries what it returns."""

    call: Callable[[Any], Any]
    emit: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
