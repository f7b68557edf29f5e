"""The scheduler thread: the only place forward passes run, fed by a bounded admission queue.

The event loop never runs the model; it submits a job and awaits the job's events. The policy
today is serial (one job at a time, its rows batched together); every admitted job gets an
answer: its events, or a JobFailed if the engine fails or shuts down first.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import torch

from millm.engine.embed import run_embedding
from millm.engine.generate import run_job
from millm.engine.jobs import EmbeddingJob, GenerationJob, ScoringJob
from millm.engine.scoring import run_scoring
from millm.engine.loader import LoadedModel
from millm.errors import GenerationFailed, InsufficientMemory, MillmError, QueueFull, ServerShuttingDown, describe

log = logging.getLogger(__name__)

Job = GenerationJob | EmbeddingJob | ScoringJob
RUNS = {GenerationJob: run_job, EmbeddingJob: run_embedding, ScoringJob: run_scoring}


class Scheduler:
    """Owns the model's compute: admits jobs up to a bound and runs them one after another."""

    def __init__(self, lm: LoadedModel, max_pending: int, *, batching: bool = False, max_batch: int = 16):
        self.lm = lm
        self.max_pending = max_pending
        self.batching, self.max_batch = batching, max_batch
        self._queue: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._stop_error: MillmError | None = None
        self.running: Job | None = None
        self.stats = {"served": 0, "cancelled": 0, "failed": 0}
        self._thread = threading.Thread(target=self._loop, name="millm-scheduler", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        """Jobs admitted and not yet started."""
        return len(self._queue)

    @property
    def running_rows(self) -> int:
        """Rows of the job being generated now (0 when idle)."""
        job = self.running
        if job is None:
            return 0
        return len(job.rows) if isinstance(job, GenerationJob) else 1

    def submit(self, job: Job) -> None:
        """Admit a job or raise QueueFull at once; never blocks."""
        with self._wake:
            if self._stopping:
                raise ServerShuttingDown("the server is shutting down")
            if len(self._queue) >= self.max_pending:
                raise QueueFull(
                    f"the request queue is full ({self.max_pending} requests waiting); retry shortly"
                )
            self._queue.append(job)
            self._wake.notify()

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not self._queue and self.running is None

    def wait_idle(self, timeout: float) -> bool:
        """Block until every admitted job has finished, or `timeout` seconds; returns whether idle."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while not self.idle:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.05))
        return True

    def shutdown(self, timeout: float | None = None, error: MillmError | None = None) -> None:
        """Stop: the running job is cancelled and answered with `error` (default: shutting down),
        as is every queued one; then the thread ends."""
        with self._wake:
            self._stopping = True
            self._stop_error = error
            running = self.running
            self._wake.notify_all()
        if running is not None and error is not None:
            running.fail(error)
        self._thread.join(timeout)

    def _next_job(self) -> Job | None:
        with self._wake:
            while not self._queue and not self._stopping:
                self._wake.wait()
            if self._stopping:
                error = self._stop_error or ServerShuttingDown("the server shut down before this request ran")
                for job in self._queue:
                    job.fail(error)
                self._queue.clear()
                return None
            return self._queue.popleft()

    def _loop(self) -> None:
        while (job := self._next_job()) is not None:
            outcome = "cancelled"
            if not job.cancelled.is_set():
                self.running = job
                try:
                    RUNS[type(job)](self.lm, job)
                    outcome = "cancelled" if job.cancelled.is_set() else "served"
                except Exception as exc:  # the job fails; the scheduler serves the next one
                    job.fail(self._as_error(exc))
                    outcome = "failed"
                finally:
                    with self._wake:
                        self.running = None
                        self._wake.notify_all()
            self.stats[outcome] += 1

    def _as_error(self, exc: Exception) -> MillmError:
        if isinstance(exc, MillmError):
            return exc
        if isinstance(exc, torch.OutOfMemoryError):
            return InsufficientMemory(
                f"{self.lm.device} ran out of memory during generation: the prompt and its KV cache do "
                "not fit beside the model; shorten the prompt or max_tokens"
            )
        log.exception("generation failed")
        return GenerationFailed(f"generation failed: {describe(exc)}")
