"""The model slot: the loaded model, its scheduler, and the requests that hold them (leases).

A request takes a lease when it resolves its model and keeps it until its HTTP exchange ends
(for a stream, after the last byte). An unload first closes the slot (no new lease), then waits
for the leases to be returned, so no request can run on a model that is being moved. A request
still holding a lease when the unload gives up waiting is refused at submit (its lease is no
longer *serving*), so it cannot reach the scheduler of a model loaded afterwards either.

Leases are found through a context variable that a per-request scope sets: the API layer opens
one scope per HTTP request, because only it sees when a streamed response has really ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from millm.engine.gpus import Placement
from millm.engine.loader import LoadedModel
from millm.engine.scheduler import Scheduler


@dataclass(eq=False)
class Lease:
    """One request's hold on one loaded model."""

    lm: LoadedModel
    generation: int  # which fill of the slot it was taken from
    released: bool = False


_held: ContextVar[list[Lease] | None] = ContextVar("millm_leases", default=None)


def current_lease() -> Lease | None:
    """The lease the running request holds, if any."""
    held = _held.get()
    return held[-1] if held else None


class ModelSlot:
    """One model at a time: filled by a load, closed and emptied by an unload."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.lm: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self.generation = 0
        self.open = False  # new leases may be taken
        self.serving = False  # leases already taken may still submit
        self.leases = 0
        self.touched: set[int] = set()  # CUDA cards a transformers model was ever placed on

    def loaded(self) -> LoadedModel | None:
        """The loaded model, if any (what plans bind probes and vectors to)."""
        return self.lm

    def generating(self) -> bool:
        """Whether requests are generating now (a job then leaves them most of the scheduler)."""
        scheduler = self.scheduler
        return scheduler is not None and scheduler.running_rows > 0

    def fill(self, lm: LoadedModel, scheduler: Scheduler) -> None:
        """A model has loaded: requests may lease it."""
        with self._cond:
            self.lm, self.scheduler = lm, scheduler
            self.generation += 1
            self.open = self.serving = True
            if lm.engine == "transformers" and lm.device.type == "cuda":
                self.touched.add(lm.device.index or 0)

    def placement(self) -> Placement:
        """Which cards this process's models were put on (what GET /api/health/gpus may measure)."""
        lm = self.lm
        on_gpu = lm is not None and lm.engine == "llama.cpp" and getattr(lm.runner, "on_gpu", False)
        return Placement(frozenset(self.touched), frozenset({0} if on_gpu else ()))

    def lease(self, name: str) -> Lease | None:
        """A lease on the loaded model if it is `name` and the slot is open, recorded in the
        request's scope."""
        held = _held.get()
        if held is None:
            raise RuntimeError("a model lease needs a request scope (ModelSwitch.request_scope)")
        with self._cond:
            if not self.open or self.lm is None or self.lm.name != name:
                return None
            self.leases += 1
            lease = Lease(self.lm, self.generation)
        held.append(lease)
        return lease

    def release(self, lease: Lease) -> None:
        """Return a lease (once); an unload waiting for the count is woken."""
        with self._cond:
            if lease.released:
                return
            lease.released = True
            if lease.generation == self.generation:
                self.leases -= 1
                self._cond.notify_all()

    def submit(self, lease: Lease, job) -> bool:
        """Admit `job` to the scheduler of the lease's model; False when that model no longer
        serves.

        Checked and admitted under the slot's lock, so an unload that stops serving cannot slip
        in between: the job is either queued before (and answered by the scheduler's shutdown)
        or refused here.
        """
        with self._cond:
            if (
                not self.serving
                or lease.released
                or lease.generation != self.generation
                or self.scheduler is None
            ):
                return False
            self.scheduler.submit(job)
            return True

    def close(self) -> None:
        """An unload begins: no new leases; held ones may still submit."""
        with self._cond:
            self.open = False

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every lease to be returned; returns whether all were."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.leases > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop_serving(self) -> None:
        """The unload stops waiting: leases still held can no longer submit."""
        with self._cond:
            self.serving = False

    def empty(self) -> tuple[LoadedModel | None, Scheduler | None]:
        """Take the model and scheduler out (the caller frees them); leases of this fill no
        longer count."""
        with self._cond:
            lm, scheduler = self.lm, self.scheduler
            self.lm = self.scheduler = None
            self.open = self.serving = False
            self.generation += 1
            self.leases = 0
            self._cond.notify_all()
        return lm, scheduler


@contextmanager
def request_scope(slot: ModelSlot) -> Iterator[None]:
    """Hold the leases one request takes, and return them when it ends."""
    held: list[Lease] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        for lease in held:
            slot.release(lease)
