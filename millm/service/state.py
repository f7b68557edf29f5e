"""ServerState: the one owner of the server's mutable state — the registered models, the model
slot and its scheduler, the steering lock, and the steering state.

Model changes (load, unload, the start-up load) run one at a time on a worker thread, never on
the event loop. Requests take a lease on the loaded model (see slot.py) that an unload waits
for, so none runs on a half-moved model.

Why this file is longer than ~400 lines: one mutex guards the slot's transition, the load
errors and the steering lock together, and every method here reads or changes them under it.
Split across files, those invariants (a locked server never loads another model; a model is
freed only once nothing can reach it; another replica's attach lands only between model
changes, see _settle_attachments) would have to be read in several places. What does not
touch them lives elsewhere: the slot (slot.py), registrations (registrations.py, models.py),
presentation (model_admin.py).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch

from millm.engine.loader import LoadedModel, load_model, pick_device
from millm.engine.loader_llamacpp import load_with_llamacpp
from millm.engine.scheduler import Scheduler
from millm.engine.sources import ModelSource
from millm.errors import (
    Conflict,
    MillmError,
    ModelBusy,
    ModelLoadFailed,
    ModelLocked,
    ModelNotLoaded,
    ModelSourceError,
    describe,
)
from millm.interp.steering import Attached
from millm.service.features.calibrations import CalibrationBook
from millm.service.features.labels import LabelBook
from millm.service.features.monitoring import Monitor
from millm.service.models.checkpoints import (
    check_memory,
    check_quantization,
    inspect,
    prefix_cache_budget,
)
from millm.service.models.engines import LLAMACPP, TRANSFORMERS, plan_load
from millm.service.models.paths import inside, resolved
from millm.service.models.registrations import ClientRegistrations
from millm.service.models.registry import ModelRegistry, ModelState, RegisteredModel
from millm.service.models.slot import ModelSlot, current_lease, request_scope
from millm.service.probes.book import ProbeBook
from millm.service.probes.conditions import ProbeConditions
from millm.service.runtime.jobs import JobBook
from millm.service.runtime.replication import Replication
from millm.service.runtime.threads import in_passing_thread
from millm.service.steering.decoders import DecoderCache
from millm.service.steering.documents import CircuitBook, ClusterBook
from millm.service.steering.live import Steering
from millm.service.steering.plans import DialLimits, Planner
from millm.service.steering.profiles import ProfileBook
from millm.service.steering.resolution import Resolvers
from millm.service.steering.saes import SAERegistry
from millm.service.steering.vectors import VectorBook
from millm.settings import Settings
from millm.store.changes import Topic
from millm.store.database import Store, database_url
from millm.store.single_process import claim_sqlite

log = logging.getLogger(__name__)

LOCK_KEY = "model_lock"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "demo"  # the demo SAEs and profiles inside the package
ATTACH_WAIT_S = 10.0  # an attach waits this long behind another attach before answering model_busy
JOBS_KEPT = 50  # ended jobs remembered for GET /api/jobs
LLAMACPP_SEQUENCES = 256  # llama.cpp's own bound on sequences in one context
SCHEDULER_STOP_S = 30.0  # how long an unload waits for the scheduler thread to end after cancelling its jobs


class ModelStatus(StrEnum):
    """Where the model slot is (readiness reports it)."""

    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    ERROR = "error"  # the last model it tried to load failed
    UNLOADED = "unloaded"  # empty after an unload, or before the start-up load began


@dataclass(frozen=True)
class Transition:
    """A model change in progress: what is being loaded and what is being unloaded for it."""

    loading: str | None = None
    unloading: str | None = None
    startup: bool = False


@dataclass(frozen=True)
class ModelView:
    """A registered model and where it is now, for the API to present."""

    entry: RegisteredModel
    state: ModelState
    error: str | None
    lm: LoadedModel | None
    locked: bool


class ServerState:
    """Holds the models, the slot and the steering state; the API asks it for all three and submits jobs through it."""

    def __init__(self, settings: Settings, source: ModelSource):
        self.settings = settings
        self.source = source
        settings.home.mkdir(parents=True, exist_ok=True)
        url = database_url(settings.home, settings.database_url)
        self._claim = claim_sqlite(url)  # DatabaseInUse when another server holds this SQLite file
        self.store = Store(url)
        self.replication = Replication(self.store)
        self.labels = LabelBook(self.store)
        self.saes = SAERegistry(self.store, settings.hub_dir, self.labels)
        self.decoders = DecoderCache()
        self.profiles = ProfileBook(self.store)
        self.probes = ProbeBook(self.store)
        self.steering = Steering(self.store, self.saes, self.profiles, self.replication)
        self.clusters = ClusterBook(self.store, settings.steering_intensity_max)
        self.circuits = CircuitBook(self.store)
        limits = DialLimits(settings.cluster_intensity_min, settings.circuit_intensity_min, settings.steering_intensity_max)
        self.planner = Planner(self.steering, self.clusters, self.circuits, limits)
        self.calibrations = CalibrationBook(self.store)
        self.vectors = VectorBook(self.store)
        self.steering.resolvers = Resolvers(ProbeConditions(self.probes, self.calibrations, lambda: self.slot.lm), self.vectors, lambda: self.slot.lm)
        for info in list(self.saes.infos.values()):  # SAEs registered before they shipped a calibration
            self.calibrations.import_shipped(info)
        self.monitor = Monitor(self.store, settings.monitoring_history)
        self.models = ModelRegistry(self.store, settings.hub_dir)
        self.registrations = ClientRegistrations(settings, source, self.saes, self.models, self.calibrations)
        self.startup_name = settings.served_model_name or source.name
        self.models.ensure(self.startup_name, source)
        self.slot = ModelSlot()
        self.jobs = JobBook(settings.max_jobs, JOBS_KEPT, settings.job_share, self._generating)
        self._mutex = threading.Lock()  # guards the fields below; never held across slow work
        self._switching = threading.Lock()  # held for a whole model change; a second one is model_busy
        self.transition: Transition | None = None
        self.last_name = self.startup_name  # the slot's model: loaded, moving, or last tried
        self.errors: dict[str, str] = {}  # model -> why its last load failed
        self._weights_bytes = 0  # the loaded model's estimated weights, released by unloading it
        self.locked: str | None = self._restore_lock()
        self._attachments_stale = False  # another replica changed the attachments; see _settle_attachments
        self._follow_other_replicas()

    def _follow_other_replicas(self) -> None:
        """What to read again when another replica changes a part of the shared state (the order
        of a full reload: registrations before the documents and the steering that name them)."""
        on = self.replication.on
        on(Topic.SAES, self.saes.reload)
        on(Topic.LABELS, self.labels.reload)
        on(Topic.CALIBRATIONS, self.calibrations.reload)
        on(Topic.MODELS, self.models.reload)
        on(Topic.VECTORS, self.vectors.refresh)
        on(Topic.PROBES, self.probes.refresh)
        on(Topic.PROFILES, self.profiles.refresh)
        on(Topic.CLUSTERS, self.clusters.refresh)
        on(Topic.CIRCUITS, self.circuits.refresh)
        on(Topic.STEERING, self._steering_changed)
        on(Topic.MONITORING, self.monitor.reload)
        self.replication.start()

    def _steering_changed(self) -> None:
        """Another replica changed the steering state: read it, then attach or detach here to match.
        Attaching loads an SAE (torch work), so it runs on a thread that ends with it, never on the
        long-lived listener thread (an idle OpenMP pool there would slow decoding; see threads.py)."""
        before = dict(self.steering.stored)
        self.steering.reload()
        if self.steering.stored == before and not self._attachments_stale:
            return
        self._attachments_stale = True
        worker = threading.Thread(target=self._settle_attachments, name="millm-attach-sync", daemon=True)
        worker.start()
        worker.join()

    def _settle_attachments(self) -> None:
        """Bring this process's attachments in line with the stored ones, unless a model change holds
        the slot: whoever releases it next calls this again (a flag and a try-lock, so no change is
        missed and the notice thread never waits behind a model load)."""
        while self._attachments_stale and self._switching.acquire(blocking=False):
            try:
                self._attachments_stale = False
                lm = self.slot.lm
                self.steering.restore(lm, self._may_read)
                if lm is not None and self.steering.attached:
                    with self._mutex:
                        self._set_lock(lm.name)
            finally:
                self._switching.release()

    def _may_read(self, path: str) -> None:
        """403 path_not_allowed unless this replica may read an SAE file at `path` (another replica's
        allowed paths may differ); the SAEs that ship with millm are always readable."""
        if not inside(resolved(path), (SHIPPED_DIR,)):
            self.registrations.paths.local(path, "path")

    def _release_switching(self) -> None:
        """End a model change or an attach, then apply attachment changes that arrived meanwhile."""
        self._switching.release()
        self._settle_attachments()

    def _restore_lock(self) -> str | None:
        locked = self.store.get_setting(LOCK_KEY)
        if locked is not None and locked != self.startup_name:
            # The operator's --model is explicit; a lock left by an earlier run on another model yields to it.
            log.warning("steering lock on %r released: this server was started with %r", locked, self.startup_name)
            self.store.set_setting(LOCK_KEY, None)
            return None
        return locked

    # what the readiness probe and the scheduler view read --------------------------------------------
    @property
    def lm(self) -> LoadedModel | None:
        """The loaded model, if any."""
        return self.slot.lm

    @property
    def scheduler(self) -> Scheduler | None:
        """The loaded model's scheduler, if any."""
        return self.slot.scheduler

    @property
    def expected_name(self) -> str:
        """The slot's model: the loaded one, the one moving in or out, or the last one tried."""
        return self.last_name

    @property
    def load_error(self) -> str | None:
        """Why the slot's model failed to load, if it did."""
        return self.errors.get(self.last_name)

    @property
    def status(self) -> ModelStatus:
        """Where the slot is now."""
        with self._mutex:
            transition = self.transition
            if transition is not None:
                return ModelStatus.UNLOADING if transition.unloading else ModelStatus.LOADING
            if self.slot.lm is not None:
                return ModelStatus.LOADED
            return ModelStatus.ERROR if self.last_name in self.errors else ModelStatus.UNLOADED

    # requests ------------------------------------------------------------------------------------------
    def request_scope(self) -> AbstractContextManager:
        """Open around each HTTP request: the leases it takes are returned when it ends."""
        return request_scope(self.slot)

    async def acquire(self, name: str) -> LoadedModel:
        """The model `name`, held by this request until it ends; when it is registered but not
        loaded, it is loaded first (on a worker thread), replacing the loaded model. A bare
        repository name means its one registered quantisation (repo:QUANT)."""
        name = self.models.canonical(name)
        lease = self._lease(name)
        if lease is None:
            await in_passing_thread(self.load, name)
            lease = self._lease(name)
            if lease is None:  # an unload began right after the load
                raise ModelBusy(f"model {name!r} is being unloaded; retry once it finishes", param="model")
        return lease.lm

    def _lease(self, name: str):
        """A lease on `name` if it is loaded; None if it has to be loaded; else the refusal (on the event loop: memory only)."""
        self.models.get(name, read_through=False)
        with self._mutex:
            if self.locked is not None and name != self.locked:
                raise self._locked_refusal(name)
            lease = self.slot.lease(name)
            if lease is not None:
                return lease
            transition = self.transition
            if transition is not None:
                if transition.startup and transition.loading == name:
                    raise ModelNotLoaded(f"model {name!r} is not loaded yet; retry once it has loaded", param="model")
                raise ModelBusy(self._busy_message(transition), param="model")
            if name in self.errors:
                raise ModelNotLoaded(
                    f"model {name!r} is not loaded: its last load failed ({self.errors[name]}); "
                    f"it is not retried on demand: POST /api/models/{name}/load once it is fixed",
                    param="model",
                )
        return None

    def submit(self, job) -> None:
        """Admit a job for the model this request holds (QueueFull at the bound; model_busy once that model stopped serving)."""
        lease = current_lease()
        if lease is None:
            raise RuntimeError("submit needs the model lease this request took with acquire()")
        if not self.slot.submit(lease, job):
            raise ModelBusy(f"model {lease.lm.name!r} is being unloaded; retry once it finishes", param="model")

    # model changes ---------------------------------------------------------------------------------
    def load(self, name: str) -> LoadedModel:
        """Make `name` the loaded model (blocking). Everything that can refuse runs before the
        loaded model is unloaded; a failure after that is a 500 model_load_failed."""
        name = self.models.canonical(name)
        self.models.get(name)
        if not self._switching.acquire(blocking=False):
            raise ModelBusy(self._busy_message(self.transition), param="model")
        try:
            return self._switch(name, startup=False)
        finally:
            self._release_switching()

    def load_in_background(self) -> threading.Thread:
        """Start the start-up load without blocking the server's start; readiness reports progress."""
        self._switching.acquire()  # taken here, so no other change can start before the thread runs

        def run() -> None:
            try:
                self._switch(self.startup_name, startup=True)
            except MillmError as exc:
                log.error("model %r failed to load: %s", self.startup_name, exc.message)
            finally:
                self._release_switching()

        with self._mutex:
            self.transition = Transition(loading=self.startup_name, startup=True)
        thread = threading.Thread(target=run, name="millm-model-load", daemon=True)
        thread.start()
        return thread

    def unload(self, name: str) -> bool:
        """Unload `name` if it is the loaded model (blocking, graceful); returns whether it was loaded."""
        name = self.models.canonical(name)
        self.models.get(name)
        if not self._switching.acquire(blocking=False):
            raise ModelBusy(self._busy_message(self.transition), param="model")
        try:
            if self.slot.lm is None or self.slot.lm.name != name:
                return False
            self._unload(Transition(unloading=name))
            return True
        finally:
            with self._mutex:
                self.transition = None
            self._release_switching()

    def _switch(self, name: str, startup: bool) -> LoadedModel:
        with self._mutex:
            if self.locked is not None and name != self.locked:
                raise self._locked_refusal(name)
            if self.slot.lm is not None and self.slot.lm.name == name:
                return self.slot.lm
            self.transition = Transition(loading=name, startup=startup)
        try:
            return self._replace(name, startup)
        except MillmError as exc:
            if startup:  # nobody to answer: the readiness probe and later requests report it
                with self._mutex:
                    self.errors[name] = exc.message
            raise
        finally:
            with self._mutex:
                self.transition = None

    def engine_for(self, name: str) -> str:
        """The engine that runs `name`: the loaded model's own, else the one a load would pick now
        (blocking: it reads the file's metadata), so a request can be refused before any load."""
        name = self.models.canonical(name)
        lm = self.slot.lm
        if lm is not None and lm.name == name:
            return lm.engine
        try:
            source = self.models.source(name)
            if not source.gguf_file:  # only a .gguf file can run on llama.cpp
                return TRANSFORMERS
            device = pick_device(self.settings.device)
            reclaimable = self._weights_bytes if lm is not None and lm.device == device else 0
            return plan_load(self.settings, source, inspect(source), device, reclaimable, None).engine
        except (ModelSourceError, OSError):
            return TRANSFORMERS  # the load itself reports what is wrong with the source

    def _replace(self, name: str, startup: bool) -> LoadedModel:
        # Only names are kept here: a reference to the outgoing model would keep its weights alive.
        current = self.slot.lm.name if self.slot.lm is not None else None
        current_device = self.slot.lm.device if self.slot.lm is not None else None
        kept = f"; {current!r} stays loaded" if current is not None else ""
        try:
            source = self.source if startup else self.models.source(name)
            checkpoint = inspect(source)
            device = pick_device(self.settings.device)
        except (ModelSourceError, OSError) as exc:
            raise ModelLoadFailed(f"could not load model {name!r}: {exc}{kept}", param="model") from None
        self.models.note(name, source, checkpoint)
        reclaimable = self._weights_bytes if current_device == device else 0
        # --max-model-len is about the start-up model; a registered model keeps its own window.
        asked = self.settings.max_model_len if name == self.startup_name else None
        try:
            plan = plan_load(self.settings, source, checkpoint, device, reclaimable, asked)
        except ModelSourceError as exc:
            raise ModelLoadFailed(f"could not load model {name!r}: {exc}{kept}", param="model") from None
        engine, needed, window = plan.engine, plan.needed, plan.window
        if plan.lowered_from is not None:
            log.warning("model %r: its %d-token window does not fit in memory beside the file; loading it with %d tokens "
                        "(--max-model-len sets it)", name, plan.lowered_from, plan.window)
        if engine == TRANSFORMERS:
            check_quantization(name, checkpoint)
        check_memory(name, needed, device, reclaimable, self.settings.memory_limit_bytes, current, plan.what)

        if current is not None:
            self._unload(Transition(loading=name, unloading=current))
            with self._mutex:
                self.transition = Transition(loading=name)
        with self._mutex:
            self.last_name = name
        try:
            dtype, cache = self.settings.dtype, self.settings.cache_dir
            if engine == LLAMACPP:
                # every row at once: the batch, a serial lane beside it, and scoring between steps
                sequences = min(LLAMACPP_SEQUENCES, self.settings.max_batch_size + 2 * self.settings.max_rows_per_request)
                lm = load_with_llamacpp(source, dtype=dtype, cache_root=cache, sequences=sequences, max_model_len=window, served_name=name)
            else:
                lm = load_model(source, dtype=dtype, device=self.settings.device, cache_root=cache, max_model_len=window, served_name=name,
                                reproducible=self.settings.reproducible)
        except Exception as exc:  # ModelSourceError says what; anything else (out of memory, ...) is named
            message = str(exc) if isinstance(exc, ModelSourceError) else f"could not load model {name!r}: {describe(exc)}"
            unloaded = f" ({current!r} was unloaded before the failure; no model is loaded now)" if current else ""
            log.error("model %r failed to load: %s", name, message)
            with self._mutex:
                self.errors[name] = message
            raise ModelLoadFailed(message + unloaded, param="model") from exc
        scheduler = Scheduler(
            lm,
            self.settings.max_pending_requests,
            batching=self.settings.enable_continuous_batching,
            max_batch=self.settings.max_batch_size,
            prefix_cache_bytes=prefix_cache_budget(self.settings.prefix_cache_bytes, lm.device),
            prefill_chunk=self.settings.prefill_chunk_tokens,
        )
        self.steering.restore(lm, self._may_read)
        if source.kind in ("demo", "packaged"):
            from millm.service.models.shipped import install_shipped

            install_shipped(self, lm)
        with self._mutex:
            self.errors.pop(name, None)
            self._weights_bytes = needed
            if self.steering.attached:  # restored SAEs bind steering to this model
                self._set_lock(name)
            self.slot.fill(lm, scheduler)
        log.info("model %s loaded (%s)", lm.name, lm.system_fingerprint)
        return lm

    def _unload(self, transition: Transition) -> None:
        """Close the slot, let running requests finish (up to GRACEFUL_UNLOAD_TIMEOUT), then free the model."""
        name = transition.unloading
        assert name is not None, "an unload names the model it unloads"
        with self._mutex:
            self.transition = transition
            self.last_name = name
        self.slot.close()
        timeout = self.settings.graceful_unload_timeout
        deadline = time.monotonic() + timeout
        log.info("unloading %s: waiting up to %g s for running requests", name, timeout)
        finished = self.slot.drain(timeout)
        scheduler = self.slot.scheduler
        # Leases end with their HTTP exchange; a job whose client left may still be stopping.
        if finished and scheduler is not None:
            finished = scheduler.wait_idle(max(0.0, deadline - time.monotonic()))
        self.slot.stop_serving()
        if scheduler is not None:
            cut = ModelBusy(
                f"model {name!r} was unloaded before this request finished "
                f"(GRACEFUL_UNLOAD_TIMEOUT is {timeout:g} s); retry",
                param="model",
            )
            if not scheduler.shutdown(timeout=SCHEDULER_STOP_S, error=cut):
                # Its thread may still be running the model: freeing it under that thread would crash
                # the process. The model stays in memory, serving nothing; a retried unload tries again.
                raise ModelBusy(
                    f"model {name!r} could not be unloaded: its scheduler thread did not stop within {SCHEDULER_STOP_S:g} s "
                    "(the server log shows where it is); it stays in memory and serves nothing; retry the unload, or restart the server",
                    param="model",
                )
        if not finished:
            log.warning("unloading %s: requests still running after %g s were ended with model_busy", name, timeout)
        self.steering.detach_all()  # stored attachments stay: a reload of this model restores them
        lm, scheduler = self.slot.empty()
        with self._mutex:
            self._weights_bytes = 0
        cuda = lm is not None and lm.device.type == "cuda"
        del lm, scheduler
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        log.info("unloaded %s", name)

    def _busy_message(self, transition: Transition | None) -> str:
        if transition is None:
            return "a model change is in progress; retry once it finishes"
        if transition.unloading and transition.loading:
            return f"model {transition.unloading!r} is being unloaded to load {transition.loading!r}; retry once it finishes"
        if transition.unloading:
            return f"model {transition.unloading!r} is being unloaded; retry once it finishes"
        return f"model {transition.loading!r} is being loaded; retry once it finishes"

    # the steering lock -------------------------------------------------------------------------------
    def _locked_refusal(self, name: str) -> ModelLocked:
        return ModelLocked(
            f"the server is locked to model {self.locked!r} for steering, so {name!r} is not loaded; "
            f"POST /api/models/{self.locked}/unlock (after detaching its SAEs) to serve other models",
            param="model",
        )

    def _set_lock(self, name: str | None) -> None:
        """Change the lock (the caller holds the mutex)."""
        if self.locked != name:
            self.locked = name
            self.store.set_setting(LOCK_KEY, name)

    def lock(self, name: str) -> None:
        """Serve only `name`: requests naming another model are refused, /v1/models lists only it."""
        self.models.get(name)
        with self._mutex:
            if self.locked is not None and self.locked != name:
                raise ModelLocked(
                    f"the server is locked to model {self.locked!r} for steering; unlock it before locking {name!r}",
                    param="model",
                )
            self._set_lock(name)

    def unlock(self, name: str) -> bool:
        """Release the lock on `name`; refused while SAEs are attached (steering is bound to it). Returns whether it was locked."""
        self.models.get(name)
        with self._mutex:
            if self.locked is None:
                return False
            if self.locked != name:
                raise ModelLocked(f"the server is locked to model {self.locked!r}, not {name!r}", param="model")
            attached = sorted(set(self.store.attachments()) | set(self.steering.attached))
            if attached:
                raise Conflict(
                    f"model {name!r} stays locked while SAEs are attached ({', '.join(attached)}); detach them first",
                    param="model",
                    code="sae_attached",
                )
            self._set_lock(None)
            return True

    def attach_sae(self, sae_id: str, layer: int | None) -> Attached:
        """Attach an SAE to the loaded model and lock the server to that model (blocking)."""
        before = self.slot.lm
        if self.transition is not None or not self._switching.acquire(timeout=ATTACH_WAIT_S):
            raise ModelBusy(self._busy_message(self.transition), param="sae_id")
        try:
            lm = self.slot.lm
            if lm is not before:
                raise ModelBusy("the loaded model changed while this attach waited; retry", param="sae_id")
            if lm is None:  # what steering.attach would refuse first
                raise ModelNotLoaded("no model is loaded to attach an SAE to")
            attached = self.steering.attach(lm, sae_id, layer)
            with self._mutex:
                self._set_lock(lm.name)
            return attached
        finally:
            self._release_switching()

    # registrations ------------------------------------------------------------------------------------
    def _state_of(self, name: str) -> ModelState:
        """The model's state (the caller holds the mutex)."""
        transition = self.transition
        if transition is not None and transition.unloading == name:
            return ModelState.UNLOADING
        if transition is not None and transition.loading == name:
            return ModelState.LOADING
        if self.slot.lm is not None and self.slot.lm.name == name:
            return ModelState.LOADED
        return ModelState.ERROR if name in self.errors else ModelState.READY

    def view(self, name: str) -> ModelView:
        """One registered model and its state (404 model_not_found if not registered)."""
        entry = self.models.get(name)
        with self._mutex:
            lm = self.slot.lm if self.slot.lm is not None and self.slot.lm.name == name else None
            return ModelView(entry, self._state_of(name), self.errors.get(name), lm, self.locked == name)

    def views(self) -> list[ModelView]:
        """Every registered model, oldest first."""
        views = []
        for entry in self.models.all():
            with self._mutex:
                lm = self.slot.lm if self.slot.lm is not None and self.slot.lm.name == entry.name else None
                views.append(ModelView(entry, self._state_of(entry.name), self.errors.get(entry.name), lm, self.locked == entry.name))
        return views

    def forget(self, name: str) -> None:
        """Delete a registration; refused (409) while it is loaded or moving, or locked."""
        self.models.get(name)
        with self._mutex:
            state = self._state_of(name)
            if state in (ModelState.LOADED, ModelState.LOADING, ModelState.UNLOADING):
                raise Conflict(f"model {name!r} is {state.value}; unload it first", param="model", code="model_loaded")
            if self.locked == name:
                raise ModelLocked(f"model {name!r} is locked for steering; unlock it first", param="model")
            self.models.forget(name)
            self.errors.pop(name, None)

    def _generating(self) -> bool:
        """Whether requests are generating now (a job then leaves them most of the scheduler)."""
        scheduler = self.slot.scheduler
        return scheduler is not None and scheduler.running_rows > 0

    def close(self) -> None:
        """Stop the jobs and the scheduler; queued requests are answered with an error."""
        self.jobs.cancel_all()
        scheduler = self.slot.scheduler
        if scheduler is not None:
            scheduler.shutdown(timeout=SCHEDULER_STOP_S)  # a thread that does not stop is logged; the process is ending
        self.monitor.close()
        self.replication.close()
        self.store.close()
        self._claim.release()
