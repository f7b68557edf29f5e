"""A generation request as serving holds it once admitted, and what serving hands back to the
API: the body (or its chunks) and how it was served."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from millm.engine.constraints import GrammarSpec
from millm.engine.loader import LoadedModel
from millm.errors import MillmError
from millm.kernel.probes.watches import NO_PROBES, ProbeSet
from millm.kernel.steering.plan import NO_STEERING, Plan
from millm.v1.objects import WireModel
from millm.v1.policy.response_format import Structured
from millm.v1.serving.activations import ActivationRead
from millm.v1.serving.protocol import SamplingFields


@dataclass(frozen=True)
class Report:
    """How a request was served, for the response headers: fields it ignored, what steered it
    (and whether the steering state moved while it ran), its seed and the seed's promise, and the
    output constraint."""

    ignored: tuple[str, ...] = ()
    plan: Plan = NO_STEERING
    seed: int | None = None
    seed_scope: str = "request"
    structured: Structured | None = None
    changed: bool = False
    in_stream: bool = False  # a stream that ends with X-miLLM-Steering's value in a chunk


@dataclass(frozen=True)
class Reply:
    """A served request: its whole body, or the chunks of its stream (a failure comes as the
    error)."""

    report: Report
    body: WireModel | None = None
    chunks: AsyncIterator[WireModel | MillmError] | None = None


@dataclass(frozen=True)
class Admitted:
    """A request admitted for generation, passed whole from admission to its answer: the model it
    holds, its prompts and sampling fields, how it is served (the report carries the steering plan),
    the output constraint, its SAE read and the probes watching it."""

    lm: LoadedModel
    body: SamplingFields
    prompts: list[list[int]]
    param: str  # the field a prompt too long for the window is refused under
    report: Report
    constraint: GrammarSpec | None = None
    read: ActivationRead | None = None
    probes: ProbeSet = NO_PROBES

    def planned(self, plan: Plan) -> Admitted:
        """The request with the plan that steers it in its report."""
        return replace(self, report=replace(self.report, plan=plan))

    @property
    def prompt_tokens(self) -> int:
        """Tokens over every prompt (usage's prompt_tokens)."""
        return sum(map(len, self.prompts))

    @property
    def choices(self) -> int:
        """Choices per prompt (`n`)."""
        return self.body.n or 1

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (stream_options.include_usage)."""
        return bool(self.body.stream_options and self.body.stream_options.include_usage)
