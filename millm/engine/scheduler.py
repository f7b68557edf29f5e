"""The scheduler thread: the only place forward passes run, fed by a bounded admission queue.

The event loop never runs the model; it submits a job and awaits the job's events. Two
policies: serial (one job at a time, its rows batched together) and, with continuous batching,
one running batch that generation jobs join after their own prefill and leave when done, beside
at most one serial lane (seeded jobs) stepped in turn, with embeddings and scoring run between
steps. A batch's scoring line runs in slices that pause for interactive work (background.py).
Every admitted job gets an answer: its events, or a JobFailed if the engine fails or
shuts down first. Over 400 lines because both policies share one queue, one lock and one
account of what runs, and they read it in each other's steps.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch

from millm.engine.background import PausedScoring, chunk_tokens
from millm.engine.calls import run_call
from millm.engine.embed import run_embedding
from millm.engine.failures import as_error
from millm.engine.generate import Lane, run_job
from millm.engine.jobs import CallJob, EmbeddingJob, GenerationJob, LikelihoodJob, ScoringJob
from millm.engine.likelihood import run_likelihood
from millm.engine.loader import LoadedModel
from millm.engine.prefix_cache import cache_for
from millm.engine.scoring import PACK_ROWS, run_packed, run_scoring
from millm.engine.waits import HoldTimes, retry_seconds
from millm.errors import (
    MillmError,
    QueueFull,
    ServerShuttingDown,
)

log = logging.getLogger(__name__)

Job = GenerationJob | EmbeddingJob | ScoringJob | LikelihoodJob | CallJob
# Each kind of job but generation to its runner (the job argument is the key's type).
RUNS: dict[type[Job], Callable[[LoadedModel, Any], str | None]] = {
    EmbeddingJob: run_embedding,
    ScoringJob: run_scoring,
    LikelihoodJob: run_likelihood,
    CallJob: run_call,
}
# Set by whoever submits work nobody waits on interactively (the batch runner, per line).
background: ContextVar[bool] = ContextVar("background_job", default=False)
OUTCOMES = ("served", "cancelled", "failed")


class Scheduler:
    """Owns the model's compute: admits jobs up to a bound and runs them, serially or batched."""

    def __init__(
        self,
        lm: LoadedModel,
        max_pending: int,
        *,
        batching: bool = False,
        max_batch: int = 16,
        prefix_cache_bytes: int = 0,
        prefill_chunk: int | None = None,
    ):
        self.lm = lm
        self.max_pending = max_pending
        # A prefix cache needs a runner that restores KV into a prefill (the lean one, llama.cpp's
        # unless the model has sliding-window layers); it belongs to this model and goes with it.
        chunked = getattr(lm.runner, "chunked", False)
        self.prefix_cache = cache_for(lm.runner, prefix_cache_bytes)
        self.prefill_chunk = prefill_chunk if chunked else None
        mergeable = getattr(lm.runner, "mergeable", False)
        self.batching, self.max_batch = batching and mergeable, max_batch
        self.batching_unavailable = None
        if batching and not mergeable:
            self.batching_unavailable = (
                f"the {lm.runner.name} runner cannot merge this model's KV cache (sliding-window "
                "or static cache layers); every request runs on the serial path"
            )
        self._queue: collections.deque[Job] = collections.deque()
        # Background jobs (a batch's lines) wait apart and enter the queue one at a time, only
        # when no interactive job waits; they are never refused as queue_full (the batch runner
        # submits one chunk at a time, which bounds them).
        self._background: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._stop_error: MillmError | None = None
        self._active: list[Job] = []
        self._holds = HoldTimes()  # what a refused client is told to wait (wait_estimate)
        self._batch_lane: Lane | None = None
        self._serial_lane: Lane | None = None
        self._serial_rows = 0
        self.stats = {backend: dict.fromkeys(OUTCOMES, 0) for backend in ("serial", "batched")}
        self.packed_jobs = 0  # scoring jobs that shared a packed pass (a batch's `pack` lines)
        # The batch's scoring line running in slices, paused while interactive work runs.
        self._paused: PausedScoring | None = None
        self.pauses = 0  # times such a line paused for interactive work
        # The most rows one batched decode step has carried since start: what a sampled
        # `batch_size` can miss when the rows are short.
        self.peak_batch_rows = 0
        self._last_interactive = float("-inf")  # when an interactive job was last admitted
        loop = self._loop_batched if self.batching else self._loop_serial
        self._thread = threading.Thread(
            target=loop, name=f"millm-scheduler[{lm.name}]", daemon=True
        )
        self._thread.start()

    @property
    def backend(self) -> str:
        """`batched` when continuous batching runs, else `serial`."""
        return "batched" if self.batching else "serial"

    @property
    def queue_depth(self) -> int:
        """Jobs admitted and not yet started."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Jobs running now, a batch's lines among them."""
        return len(self._active)

    @property
    def background_waiting(self) -> int:
        """A batch's lines waiting for the queue to be free of interactive jobs."""
        return len(self._background)

    @property
    def running_rows(self) -> int:
        """Rows generating now, in the batch and on the serial path together."""
        serial = self._serial_lane
        return self.batch_rows + self._serial_rows + (len(serial.rows) if serial is not None else 0)

    @property
    def batch_rows(self) -> int:
        """Rows in the continuous batch now (0 on the serial policy)."""
        lane = self._batch_lane
        return len(lane.rows) if lane is not None else 0

    def submit(self, job: Job) -> None:
        """Admit a job or raise QueueFull at once; never blocks."""
        with self._wake:
            if self._stopping:
                raise ServerShuttingDown("the server is shutting down")
            if background.get():
                job.background = True
                self._background.append(job)
                self._wake.notify()
                return
            if len(self._queue) >= self.max_pending:
                raise QueueFull(
                    f"the request queue is full ({self.max_pending} requests waiting); retry "
                    "shortly",
                    retry_after=retry_seconds(self.wait_estimate),
                )
            self._queue.append(job)
            self._last_interactive = time.monotonic()
            self._wake.notify()

    @property
    def wait_estimate(self) -> float | None:
        """Seconds a job admitted now would wait before it runs (engine/waits.py; None until
        measured)."""
        with self._wake:
            return self._holds.estimate(len(self._queue), len(self._active))

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not self._queue and not self._background and not self._active

    def wait_idle(self, timeout: float) -> bool:
        """Block until every admitted job has finished, or `timeout` seconds; returns whether
        idle."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while not self.idle:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.05))
        return True

    def shutdown(self, timeout: float | None = None, error: MillmError | None = None) -> bool:
        """Stop. With `error`, running and queued jobs are cancelled and answered with it; without,
        running jobs finish and queued ones are told the server shut down. Then the thread ends.

        Returns whether the thread ended within `timeout`. When it did not, it may still be running
        the model, so the caller must not free the model; the error log names the thread and where
        it is.
        """
        with self._wake:
            self._stopping = True
            self._stop_error = error
            running = list(self._active)
            self._wake.notify_all()
        if error is not None:
            for job in running:
                job.fail(error)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error(
                "%s did not stop within %s s and may still be using the model (do not free it); "
                "it is at:\n%s",
                self._describe_thread(),
                timeout,
                self._stack(),
            )
            return False
        return True

    @property
    def thread_alive(self) -> bool:
        """Whether the scheduler thread is still running."""
        return self._thread.is_alive()

    def _describe_thread(self) -> str:
        return (
            f"scheduler thread {self._thread.name!r} (ident {self._thread.ident}, model "
            f"{self.lm.name!r})"
        )

    def _stack(self) -> str:
        # Where the thread is stuck is what the operator needs to know, and only this thread can
        # say.
        frame = sys._current_frames().get(self._thread.ident or -1)
        return (
            "".join(traceback.format_stack(frame))
            if frame is not None
            else "(no stack: the thread has just ended)"
        )

    # shared by both policies -------------------------------------------------------------------
    def _fail_queued(self) -> None:
        """Under the lock: answer every queued job (the scheduler is stopping)."""
        error = self._stop_error or ServerShuttingDown(
            "the server shut down before this request ran"
        )
        for job in (*self._queue, *self._background):
            job.fail(error)
        self._queue.clear()
        self._background.clear()

    def _waiting(self) -> bool:
        """Under the lock: whether a job waits to start, a background one entering the queue
        only when no interactive one waits and no other background line is paused."""
        if not self._queue and self._background and self._paused is None:
            self._queue.append(self._background.popleft())
        return bool(self._queue)

    def _resume(self, backend: str, budget: float | None) -> None:
        """Run the paused line until it ends, an interactive job waits, or `budget` seconds."""
        paused = self._paused
        assert paused is not None
        try:
            ended = paused.run(lambda: bool(self._queue), budget)
        except Exception as exc:  # the line fails; the scheduler serves the next one
            paused.job.fail(as_error(self.lm.device, exc))
            self._paused = None
            self._ended(paused.job, backend, "failed")
            return
        if not ended:  # it paused once
            self.pauses += 1
        if ended:
            self._paused = None
            self._ended(paused.job, backend)

    def _end_paused(self, backend: str) -> None:
        """The scheduler stops: a paused line is finished (or, stopping on an error, failed)."""
        if self._paused is None:
            return
        if self._stop_error is None:
            self._resume(backend, None)
            return
        paused, self._paused = self._paused, None
        paused.close()
        paused.job.fail(self._stop_error)
        self._ended(paused.job, backend, "failed")

    def _started(self, job: Job) -> None:
        with self._wake:
            self._active.append(job)
            self._holds.began(job)

    def _ended(self, job: Job, backend: str, outcome: str | None = None) -> None:
        outcome = outcome or ("cancelled" if job.cancelled.is_set() else "served")
        with self._wake:
            if job in self._active:
                self._active.remove(job)
            self._holds.ended(job, served=outcome == "served")
            self.stats[backend][outcome] += 1
            self._wake.notify_all()

    def _run_whole(self, job: Job, backend: str) -> None:
        """Run one job start to end (serial generation, embeddings, scoring)."""
        if job.cancelled.is_set():
            self._ended(job, backend, "cancelled")
            return
        if isinstance(job, ScoringJob) and job.packable and (partners := self._partners()):
            self._run_pack([job, *partners], backend)
            return
        if isinstance(job, ScoringJob) and job.background:  # runs in slices, from the loop
            self._started(job)
            self._paused = PausedScoring(
                self.lm, job, self.prefix_cache, lambda: chunk_tokens(self._last_interactive)
            )
            return
        self._started(job)
        if isinstance(job, GenerationJob):
            self._serial_rows = len(job.rows)
        try:
            outcome: str | None
            if isinstance(job, GenerationJob):
                outcome = run_job(self.lm, job, self.prefix_cache)
            elif isinstance(job, ScoringJob):
                run_scoring(self.lm, job, self.prefix_cache)
                outcome = None
            else:
                outcome = RUNS[type(job)](self.lm, job)
            self._ended(job, backend, outcome)
        except Exception as exc:  # the job fails; the scheduler serves the next one
            job.fail(as_error(self.lm.device, exc))
            self._ended(job, backend, "failed")
        finally:
            self._serial_rows = 0

    def _partners(self) -> list[ScoringJob]:
        """Packable scoring jobs waiting at the head of the background queue (a batch's lines),
        taken to share a pass; interactive jobs are never reordered."""
        taken: list[ScoringJob] = []
        with self._wake:
            while len(taken) < PACK_ROWS - 1 and self._background:
                head = self._background[0]
                if not (isinstance(head, ScoringJob) and head.packable):
                    break
                taken.append(head)
                self._background.popleft()
        return taken

    def _run_pack(self, jobs: list[ScoringJob], backend: str) -> None:
        """Packable jobs in shared passes; if that fails (out of memory, say), each runs alone,
        so only a job that fails alone fails."""
        running = [job for job in jobs if not job.cancelled.is_set()]
        for job in jobs:
            if job.cancelled.is_set():
                self._ended(job, backend, "cancelled")
            else:
                self._started(job)
        try:
            run_packed(self.lm, running)
        except Exception:
            log.warning("a packed scoring pass failed; its %d jobs run alone", len(running))
            for job in running:
                try:
                    run_scoring(self.lm, job)
                    self._ended(job, backend)
                except Exception as exc:
                    job.fail(as_error(self.lm.device, exc))
                    self._ended(job, backend, "failed")
            return
        self.packed_jobs += len(running)
        for job in running:
            self._ended(job, backend)

    # serial policy -----------------------------------------------------------------------------
    def _loop_serial(self) -> None:
        while True:
            with self._wake:
                while not self._waiting() and self._paused is None and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    self._fail_queued()
                    break
                job = self._queue.popleft() if self._queue else None
            if job is not None:
                self._run_whole(job, "serial")
                job = None  # freed as it ends, not kept until the next job comes
            else:  # only a paused line is left: on with it until interactive work comes
                self._resume("serial", None)
        self._end_paused("serial")

    # continuous batching -------------------------------------------------------------------------
    def _take(self, batch: Lane, serial: Lane | None) -> list[Job]:
        """Under the lock: pop the queued jobs that can start now, in order (first come, first
        served)."""
        taken: list[Job] = []
        rows = len(batch.rows)
        serial_free = serial is None
        while self._queue:
            job = self._queue[0]
            if isinstance(job, GenerationJob) and not job.cancelled.is_set():
                if self._needs_serial(job):
                    if not serial_free:
                        break
                    serial_free = False
                else:
                    # One joining set at a time; a job wider than the batch bound still runs, alone.
                    if batch.joining is not None or (
                        rows and rows + len(job.rows) > self.max_batch
                    ):
                        break
                    rows += len(job.rows)
            taken.append(self._queue.popleft())
        return taken

    @staticmethod
    def _needs_serial(job: GenerationJob) -> bool:
        # A seed's promise is per request, and the batch's composition changes the arithmetic;
        # constrained rows are refused upstream under batching, and would still run alone here.
        # A request's own SAE read is served on the serial path, as the spec says.
        return job.serial or any(
            spec.seed is not None
            or spec.constraint is not None
            or any(r.tag == "activations" for r in spec.reads)
            for spec in job.rows
        )

    def _start(self, taken: list[Job], batch: Lane) -> Lane | None:
        """Start taken jobs: embeddings/scoring run now, batched jobs join the batch together (one
        prefill), a serial job gets its own lane, which is returned."""
        joining, serial = [], None
        for job in taken:
            if not isinstance(job, GenerationJob):
                self._run_whole(job, "batched")
            elif job.cancelled.is_set():
                self._ended(job, "batched", "cancelled")
            elif self._needs_serial(job):
                serial = self._join(Lane(self.lm, self.prefix_cache), [job], "serial")
            else:
                joining.append(job)
        if joining:
            self._join(batch, joining, "batched")
        return serial

    def _join(self, lane: Lane, jobs: list[GenerationJob], backend: str) -> Lane | None:
        """Admit jobs to a lane (their prefill then runs by `_advance`); None if they failed at
        once."""
        for job in jobs:
            self._started(job)
        try:
            lane.admit(*jobs)
        except Exception as exc:  # the joining jobs fail; the lane's rows are untouched
            self._fail_joining(jobs, exc, backend)
            return None
        return lane

    def _advance(self, lane: Lane, backend: str, running: bool) -> None:
        """The next chunk of a lane's joining prefill (all of it when no row is running
        anywhere)."""
        assert lane.joining is not None
        jobs = lane.joining.jobs
        try:
            ended = lane.advance(self.prefill_chunk if running else None)
        except Exception as exc:  # the joining jobs fail; the lane's rows are untouched
            lane.joining = None
            self._fail_joining(jobs, exc, backend)
            return
        for job, outcome in ended:
            self._ended(job, backend, outcome)

    def _fail_joining(self, jobs, exc: Exception, backend: str) -> None:
        error = as_error(self.lm.device, exc)
        for job in jobs:
            job.fail(error)
            self._ended(job, backend, "failed")

    def _step(self, lane: Lane, backend: str) -> None:
        """One step of a lane; a failure fails every job in it and empties it."""
        if lane is self._batch_lane:
            self.peak_batch_rows = max(self.peak_batch_rows, len(lane.rows))
        try:
            ended = lane.step()
        except Exception as exc:
            error = as_error(self.lm.device, exc)
            ended = []
            for job in lane.jobs:
                job.fail(error)
                self._ended(job, backend, "failed")
            lane.reset()
        for job, outcome in ended:
            self._ended(job, backend, outcome)

    @torch.inference_mode()
    def _loop_batched(self) -> None:
        batch = self._batch_lane = Lane(self.lm, self.prefix_cache)
        serial: Lane | None = None
        while True:
            with self._wake:
                while (
                    not self._waiting()
                    and not self._stopping
                    and not batch.rows
                    and batch.joining is None
                    and serial is None
                    and self._paused is None
                ):
                    self._wake.wait()
                if self._stopping:
                    self._fail_queued()
                    if self._stop_error is not None or not (
                        batch.rows or batch.joining or serial is not None
                    ):
                        break
                    taken = []
                else:
                    taken = self._take(batch, serial)
            lane = self._start(taken, batch)
            # the lanes hold what runs; a finished job must not wait here for the next one
            # (a call's tensors, a prompt's reads: freed as soon as it ends)
            taken = []
            if lane is not None:
                serial = self._serial_lane = lane
            # A joining prefill runs a chunk between two steps while rows are running, else whole.
            running = bool(batch.rows) or (serial is not None and bool(serial.rows))
            began = time.monotonic()
            if batch.joining is not None:
                self._advance(batch, "batched", running)
            if batch.rows:
                self._step(batch, "batched")
            if serial is not None:
                if serial.joining is not None:
                    self._advance(serial, "serial", running)
                if serial.rows:
                    self._step(serial, "serial")
                if not serial.rows and serial.joining is None:
                    serial = self._serial_lane = None
            if self._paused is not None and not self._queue:
                # Beside running rows a paused line gets as long as their step took: half the
                # machine each; alone, it runs until interactive work comes.
                busy = bool(batch.rows) or batch.joining is not None or serial is not None
                self._resume("batched", time.monotonic() - began if busy else None)
        self._end_paused("batched")
        for lane, backend in ((batch, "batched"), (serial, "serial")):
            if lane is None:
                continue
            joining = lane.joining.jobs if lane.joining is not None else ()
            for job in [*lane.jobs, *joining]:
                job.fail(self._stop_error or ServerShuttingDown("the server shut down"))
                self._ended(job, backend, "failed")
        self.lm.residual.clear()
