"""How long a job admitted now would wait: what a client refused with queue_full is told
(Retry-After) and what /api/health/inference reports.

The median time the last WAIT_SAMPLES served jobs held the engine, times the jobs ahead per job
running at once. Unmeasured (fewer than WAIT_MIN_SAMPLES served) is None, never 0.
"""

from __future__ import annotations

import collections
import math
import statistics
import time

WAIT_SAMPLES = 50  # jobs whose time on the engine the estimate reads
WAIT_MIN_SAMPLES = 3
RETRY_AFTER_MAX = 60  # a queue's wait said as Retry-After, at most (seconds)


def retry_seconds(estimate: float | None) -> int | None:
    """A wait estimate as Retry-After's whole seconds, 1 to RETRY_AFTER_MAX (None: the error's
    own default)."""
    return None if estimate is None else min(RETRY_AFTER_MAX, max(1, math.ceil(estimate)))


class HoldTimes:
    """When each running job started and how long the last served ones held the engine (its
    owner's lock guards it)."""

    def __init__(self) -> None:
        self._began: dict[int, float] = {}
        self._held: collections.deque[float] = collections.deque(maxlen=WAIT_SAMPLES)

    def began(self, job: object, at: float | None = None) -> None:
        """A job started running (`at`: the monotonic clock's reading, now by default)."""
        self._began[id(job)] = time.monotonic() if at is None else at

    def ended(self, job: object, served: bool, at: float | None = None) -> None:
        """A job ended; a served one's time on the engine is kept."""
        began = self._began.pop(id(job), None)
        if began is not None and served:
            self._held.append((time.monotonic() if at is None else at) - began)

    def estimate(self, queued: int, running: int) -> float | None:
        """Seconds until a job admitted now would start (None: not yet measured)."""
        if len(self._held) < WAIT_MIN_SAMPLES:
            return None
        return statistics.median(self._held) * (queued + running) / max(1, running)
