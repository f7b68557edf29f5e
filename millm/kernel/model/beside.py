"""A registered model loaded beside the served one for the length of one job (an explaining job's
explainer or scorer, or a transformers copy of a GGUF file served on llama.cpp for an attribution
graph), with a scheduler of its own, then freed.

The served model stays loaded and serving; the model beside it is the job's alone (no request can
name it while it is there). Its load is planned as any load is (loading.py) but with nothing to
reclaim, so it is refused before the job starts when it does not fit beside what is loaded (503
insufficient_memory with the figures, or MILLM_MEMORY_LIMIT_BYTES). One model at a time is held
beside the served one: a second job asking for one while it is held is refused with model_busy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from millm.engine.loader import LoadedModel
from millm.engine.scheduler import Scheduler
from millm.errors import AmbiguousModelName, InvalidRequest, ModelBusy, ModelNotFound
from millm.kernel.model import loading, unloading
from millm.kernel.model.loading import Outgoing, Planned
from millm.kernel.model.registry import ModelRegistry
from millm.settings import Settings

log = logging.getLogger(__name__)

NOTHING_RECLAIMED = Outgoing(None, None, 0)  # the served model stays: its memory is not freed


class Beside:
    """A model loaded beside the served one: its jobs go to its own scheduler. Let go, it holds
    neither, so the weights are freed even where a caller keeps this object."""

    def __init__(self, lm: LoadedModel, scheduler: Scheduler):
        self.name = lm.name
        self._lm: LoadedModel | None = lm
        self._scheduler: Scheduler | None = scheduler

    @property
    def lm(self) -> LoadedModel:
        """The loaded model (ModelBusy once let go)."""
        if self._lm is None:
            raise ModelBusy(f"model {self.name!r} was freed when its job let it go")
        return self._lm

    @property
    def scheduler(self) -> Scheduler:
        """Its scheduler (ModelBusy once let go)."""
        if self._scheduler is None:
            raise ModelBusy(f"model {self.name!r} was freed when its job let it go")
        return self._scheduler

    def submit(self, job) -> None:
        """Admit an engine job (QueueFull at the scheduler's bound)."""
        self.scheduler.submit(job)

    def let_go(self) -> None:
        """Drop the model and its scheduler (after the scheduler stopped)."""
        self._lm = self._scheduler = None


class ModelsBeside:
    """Plans, loads and frees the one model a job may hold beside the served one."""

    def __init__(self, settings: Settings, models: ModelRegistry):
        self.settings, self.models = settings, models
        self._held = threading.Lock()

    def plan(self, name: str, param: str) -> Planned:
        """Every check a load of `name` beside the served model can fail, before any job starts
        (blocking: it reads the checkpoint's metadata): 400 naming `param` for a model that is not
        registered, the load's own refusals (memory, quantisation) otherwise."""
        try:
            name = self.models.canonical(name)
            self.models.get(name)
        except (ModelNotFound, AmbiguousModelName) as exc:
            raise InvalidRequest(f"{param}: {exc.message}", param=param, code=exc.code) from None
        source = self.models.source(name)
        return loading.plan(self.settings, self.models, name, source, None, NOTHING_RECLAIMED)

    def plan_copy(self, lm: LoadedModel) -> Planned:
        """A transformers copy of the served model's own file, for work that differentiates the
        weights llama.cpp keeps to itself (attribution graphs); the load's refusals (memory: the
        copy is dequantised) come now, before any job starts."""
        settings = self.settings.model_copy(update={"engine": "transformers"})
        return loading.plan(settings, self.models, lm.name, lm.source, None, NOTHING_RECLAIMED)

    @contextmanager
    def loaded(self, planned: Planned) -> Iterator[Beside]:
        """The planned model loaded beside the served one until the block ends (blocking: the
        load); model_busy while another job holds one."""
        if not self._held.acquire(blocking=False):
            raise ModelBusy(
                f"another job holds a model beside the served one; {planned.name!r} waits for it "
                "to end"
            )
        try:
            log.info("loading %s beside the served model", planned.name)
            lm = loading.load(self.settings, planned)
            scheduler = loading.scheduler_for(self.settings, lm)
            held = Beside(lm, scheduler)
            try:
                yield held
            finally:
                unloading.stop(scheduler, planned.name, self.settings.graceful_unload_timeout)
                cuda = lm.device.type == "cuda"
                held.let_go()
                del lm, scheduler
                unloading.collect(cuda)
                log.info("freed %s (it was loaded beside the served model)", planned.name)
        finally:
            self._held.release()
