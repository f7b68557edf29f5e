"""What serving a request hands back to the API: the body (or its chunks) and how it was served."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from millm.errors import MillmError
from millm.protocol.responses import WireModel
from millm.service.serving.structured import Structured
from millm.service.steering.live import NO_STEERING, Plan


@dataclass(frozen=True)
class Report:
    """How a request was served, for the response headers: fields it ignored, what steered it,
    its seed and the seed's promise, and the output constraint."""

    ignored: tuple[str, ...] = ()
    plan: Plan = NO_STEERING
    seed: int | None = None
    seed_scope: str = "request"
    structured: Structured | None = None


@dataclass(frozen=True)
class Reply:
    """A served request: its whole body, or the chunks of its stream (a failure comes as the error)."""

    report: Report
    body: WireModel | None = None
    chunks: AsyncIterator[WireModel | MillmError] | None = None
