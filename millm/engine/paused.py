"""Work that may pause: a forward pass as a generator that yields between its blocks, so the
scheduler can run a chat in the gap and then resume the pass where it stopped.

A paused pass keeps its own KV buffer and hidden state, but not the residual stream's hooks:
whatever ran in the gap installed its own. A resumed pass is told so (it is sent True) and
installs its own again before its next block (`resumed`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

T = TypeVar("T")

# A pass a step at a time: each `yield` is a point where it may pause; what it is sent on resuming
# says whether other work ran since (True) or not (None); it returns its result.
Steps = Generator[None, "bool | None", T]


def drained(steps: Generator[None, None, T]) -> T:
    """Run steps to their end without pausing; their result."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def resumed(steps: Generator[None, None, T], restore: Callable[[], None]) -> Steps[T]:
    """`steps` passed through, calling `restore` before the next step whenever it is resumed
    after other work ran (the pass's own residual hooks, installed again)."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value
        if (yield):
            restore()
