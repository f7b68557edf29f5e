"""Long work as jobs (calibration, AutoSteer, probe and vector training): progress, an ETA,
cancellation, a bounded number at once.

A job's work function runs on its own thread and never touches torch: every forward pass and
every SAE encode it needs is submitted to the scheduler thread as a small engine job (see
blocking.py), so serving and the job take turns on the one thread that runs the model. While
requests are generating, `JobHandle.pace` leaves the scheduler to them for most of the time
(`MILLM_JOB_SHARE`), so a calibration slows a concurrent chat stream by a bounded factor.

Jobs live in memory: what they produce that must survive (a calibration, a profile) is stored
by the work itself; a restart forgets the job records, not their results.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from millm.errors import MillmError, NotFound, QueueFull, describe

log = logging.getLogger(__name__)
LOG_EVERY_S = 10.0  # progress is logged at most this often per job (and at every 10%)
LOOP_POLL_S = 0.25  # how often a job run on the event loop looks for its cancellation


class JobState(StrEnum):
    """Where a job is."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobCancelled(Exception):
    """Raised inside a job's work when it was cancelled; the job ends as `cancelled`."""


class JobWorkFailed(Exception):
    """Raised by a job's work that ran to its end without doing what it was for (an explaining
    job that wrote nothing): the job ends `failed` with this error, and keeps `result`, which says
    what happened to each item, since that is what the user needs to act on."""

    def __init__(self, message: str, *, code: str, result: dict):
        super().__init__(message)
        self.result = result
        self.error = {"message": message, "type": "server_error", "param": None, "code": code}


class JobProgress(BaseModel):
    """Units done of the total (the unit is the job's: texts, settings)."""

    done: int
    total: int
    unit: str


class JobView(BaseModel):
    """A job as `GET /api/jobs/{id}` shows it."""

    id: str
    object: str = "job"
    kind: str
    description: str
    state: JobState
    progress: JobProgress
    created_at: float
    started_at: float | None
    finished_at: float | None
    # seconds left at the pace so far (None until a unit is done, and once ended)
    eta_s: float | None
    # Once ended, what the job did; while running, what it has reported so far (most jobs: None).
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class _Record:
    """A job's mutable record; read and written under the book's lock."""

    def __init__(self, kind: str, description: str, total: int, unit: str):
        self.id = f"job_{uuid.uuid4().hex[:12]}"
        self.kind, self.description, self.unit = kind, description, unit
        self.total, self.done = total, 0
        self.state = JobState.RUNNING
        self.created_at = self.started_at = time.time()
        self.finished_at: float | None = None
        self.result: dict | None = None
        self.error: dict | None = None
        self.cancel = threading.Event()
        self.logged_at, self.logged_tenth = time.monotonic(), 0

    def view(self) -> JobView:
        eta = None
        if self.state is JobState.RUNNING and self.done > 0:
            elapsed = time.time() - self.started_at
            eta = round(elapsed / self.done * max(self.total - self.done, 0), 1)
        return JobView(
            id=self.id,
            kind=self.kind,
            description=self.description,
            state=self.state,
            progress=JobProgress(done=self.done, total=self.total, unit=self.unit),
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            eta_s=eta,
            result=self.result,
            error=self.error,
        )


class JobHandle:
    """What a job's work sees: report progress, learn of cancellation, yield to serving."""

    def __init__(self, book: JobBook, record: _Record):
        self._book, self._record = book, record

    @property
    def id(self) -> str:
        """The job's id."""
        return self._record.id

    @property
    def cancel_event(self) -> threading.Event:
        """Set when the job is cancelled (engine jobs submitted for it watch it)."""
        return self._record.cancel

    def check(self) -> None:
        """Raise JobCancelled if the job was cancelled."""
        if self._record.cancel.is_set():
            raise JobCancelled()

    def report(self, result: dict) -> None:
        """What the job has done so far, shown as its `result` while it runs (replaced at its
        end)."""
        with self._book.lock:
            self._record.result = result

    def set_total(self, total: int) -> None:
        """The number of units the job will do (known once its input is read)."""
        with self._book.lock:
            self._record.total = total

    def advance(self, units: int = 1) -> None:
        """`units` more are done; logs progress now and then."""
        with self._book.lock:
            record = self._record
            record.done += units
            tenth = record.done * 10 // max(record.total, 1)
            due = tenth > record.logged_tenth or time.monotonic() - record.logged_at >= LOG_EVERY_S
            if due:
                record.logged_tenth, record.logged_at = tenth, time.monotonic()
                view = record.view()
        if due:
            log.info(
                "%s %s: %d/%d %s, eta %s s",
                view.kind,
                view.id,
                view.progress.done,
                view.progress.total,
                view.progress.unit,
                view.eta_s,
            )

    def pace(self, elapsed: float) -> None:
        """After a piece of scheduler work that took `elapsed` seconds: while requests are
        generating, wait long enough that the job holds at most MILLM_JOB_SHARE of the scheduler."""
        if not self._book.serving_busy():
            return
        share = self._book.share
        self._record.cancel.wait(elapsed * (1.0 - share) / share)
        self.check()

    async def pace_on_loop(self, elapsed: float) -> None:
        """`pace` for work that runs on the event loop (on_loop): the loop sleeps, no thread
        waits."""
        if self._book.serving_busy():
            share = self._book.share
            await asyncio.sleep(elapsed * (1.0 - share) / share)
        self.check()


class JobBook:
    """The server's jobs: at most `max_running` at once (503 queue_full past it), the last `kept`
    remembered."""

    def __init__(self, max_running: int, kept: int, share: float, serving_busy: Callable[[], bool]):
        self.max_running, self.kept, self.share = max_running, kept, share
        self.serving_busy = serving_busy
        self.lock = threading.Lock()
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def start(
        self,
        kind: str,
        description: str,
        total: int,
        unit: str,
        work: Callable[[JobHandle], dict],
        *,
        result: dict | None = None,
    ) -> JobView:
        """Start `work` on its own thread and return the new job; its return value becomes the
        result (`result`: what the running job shows until it reports more)."""
        with self.lock:
            running = sum(1 for r in self._records.values() if r.state is JobState.RUNNING)
            if running >= self.max_running:
                raise QueueFull(
                    f"{running} jobs are running (MILLM_MAX_JOBS = {self.max_running}); wait for "
                    f"one to end or cancel it (DELETE /api/jobs/{{id}})"
                )
            record = _Record(kind, description, total, unit)
            record.result = result
            self._records[record.id] = record
            self._forget_old()
            view = record.view()
        thread = threading.Thread(
            target=self._run,
            args=(record, work),
            name=f"millm-job[{kind}:{record.id}]",
            daemon=True,
        )
        thread.start()
        log.info("%s %s started: %s", kind, record.id, description)
        return view

    def _run(self, record: _Record, work: Callable[[JobHandle], dict]) -> None:
        try:
            result = work(JobHandle(self, record))
            state, error = JobState.SUCCEEDED, None
        except JobCancelled:
            result, state, error = None, JobState.CANCELLED, None
        except JobWorkFailed as exc:
            result, state, error = exc.result, JobState.FAILED, exc.error
        except MillmError as exc:
            result, state, error = None, JobState.FAILED, exc.to_dict()
        except Exception as exc:  # a bug in the work: the job fails, the server goes on
            log.exception("%s %s failed", record.kind, record.id)
            result, state, error = (
                None,
                JobState.FAILED,
                {
                    "message": describe(exc),
                    "type": "server_error",
                    "param": None,
                    "code": "job_failed",
                },
            )
        if state is JobState.SUCCEEDED and record.cancel.is_set():
            state = JobState.CANCELLED  # cancelled after its last check: the result is not reported
            result = None
        with self.lock:
            record.state, record.result, record.error = state, result, error
            record.finished_at = time.time()
        log.info(
            "%s %s %s",
            record.kind,
            record.id,
            state.value + (f": {error['message']}" if error else ""),
        )

    def _forget_old(self) -> None:
        """Under the lock: drop the oldest ended jobs past `kept`."""
        ended = [key for key, r in self._records.items() if r.state is not JobState.RUNNING]
        for key in ended[: max(0, len(self._records) - self.kept)]:
            del self._records[key]

    def get(self, job_id: str) -> JobView:
        """The job, or 404 job_not_found."""
        with self.lock:
            record = self._records.get(job_id)
            if record is None:
                raise NotFound(
                    f"no job {job_id!r} (jobs are kept in memory: the last {self.kept}, until a "
                    "restart)",
                    param="job_id",
                    code="job_not_found",
                )
            return record.view()

    def all(self) -> list[JobView]:
        """Every remembered job, newest first."""
        with self.lock:
            return [r.view() for r in reversed(self._records.values())]

    def cancel(self, job_id: str) -> JobView:
        """Ask a running job to stop (it ends as `cancelled` at its next check); an ended job is
        returned as it is."""
        with self.lock:
            record = self._records.get(job_id)
        if record is None:
            return self.get(job_id)  # the 404
        record.cancel.set()
        return self.get(job_id)

    def cancel_all(self) -> None:
        """The server is stopping: every running job is asked to stop."""
        with self.lock:
            records = list(self._records.values())
        for record in records:
            record.cancel.set()


def on_loop(
    loop: asyncio.AbstractEventLoop, work: Callable[[JobHandle], Coroutine[Any, Any, dict]]
) -> Callable[[JobHandle], dict]:
    """A job's work that runs the coroutine `work(handle)` on the server's event loop (where
    request-path code awaits the engine) while the job's thread waits for it; a cancelled job
    cancels the coroutine at its next await."""

    def run(handle: JobHandle) -> dict:
        future = asyncio.run_coroutine_threadsafe(work(handle), loop)
        while True:
            try:
                return future.result(timeout=LOOP_POLL_S)
            except concurrent.futures.TimeoutError:
                if handle.cancel_event.is_set():
                    future.cancel()
                    handle.check()
            except concurrent.futures.CancelledError:
                handle.check()
                raise

    return run
