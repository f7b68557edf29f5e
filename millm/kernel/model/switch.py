"""The model switch: which model the slot holds, and the one mutex under which it changes.

Model changes (load, unload, the start-up load) run one at a time on a worker thread, never on
the event loop. Requests lease the loaded model (slot.py) and an unload waits for the leases, so
none runs on a half-moved model. One mutex guards the slot's transition, the load errors and the
steering lock together: a locked server never loads another model; a model is freed only once
nothing can reach it; another replica's attach lands only between model changes (see
settle_attachments). Beside it: the load's plan and checks (loading.py), the slot (slot.py),
the values and refusals it reports (transitions.py).

Over 400 lines because every step that changes the slot (load, unload, lock, the start-up load,
another replica's attach) runs under the one mutex this class owns; its helpers already live in
the modules named above."""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager

from millm.engine.loader import LoadedModel
from millm.engine.scheduler import Scheduler
from millm.engine.sources import ModelSource
from millm.errors import (
    MillmError,
    ModelBusy,
    ModelLoadFailed,
    ModelNotLoaded,
    ModelNotResident,
)
from millm.interp.steering import Attached
from millm.kernel.model import loading, unloading
from millm.kernel.model.beside import ModelsBeside
from millm.kernel.model.leases import LeaseBook, presented
from millm.kernel.model.loading import Outgoing
from millm.kernel.model.lock import SteeringLock
from millm.kernel.model.registrations import ClientRegistrations
from millm.kernel.model.registry import ModelRegistry
from millm.kernel.model.shipped import Shipped
from millm.kernel.model.slot import ModelSlot, current_lease, request_scope
from millm.kernel.model.startup_saes import StartupSAEs
from millm.kernel.model.transitions import (
    ModelStatus,
    ModelView,
    Transition,
    busy,
    state_of,
    status_of,
    unforgettable,
    unleased,
    view_of,
)
from millm.kernel.model.unloading import retire
from millm.kernel.runtime.threads import in_passing_thread
from millm.kernel.steering.live import Steering
from millm.settings import Settings
from millm.store.database import Store
from millm.store.steering import attachments

log = logging.getLogger(__name__)

ATTACH_WAIT_S = 10.0  # an attach waits this long behind another attach before answering model_busy


class ModelSwitch:
    """Loads, unloads and locks the served model; requests lease it and submit jobs through it."""

    def __init__(
        self,
        settings: Settings,
        source: ModelSource,
        store: Store,
        models: ModelRegistry,
        steering: Steering,
        registrations: ClientRegistrations,
        shipped: Shipped,
        startup_saes: StartupSAEs,
        slot: ModelSlot,
    ):
        self.settings, self.source, self.store, self.slot = settings, source, store, slot
        self.models, self.steering = models, steering
        self.registrations, self.shipped = registrations, shipped
        self.startup_saes = startup_saes  # --sae: attached whenever the start-up model loads
        self.startup_name = settings.served_model_name or source.name
        models.ensure(self.startup_name, source)
        self._mutex = threading.Lock()  # guards the fields below; never held across slow work
        # held for a whole model change; a second one is model_busy
        self._switching = threading.Lock()
        self.transition: Transition | None = None
        self.last_name = self.startup_name  # the slot's model: loaded, moving, or last tried
        self.errors: dict[str, str] = {}  # model -> why its last load failed
        self._weights_bytes = 0  # the loaded model's estimated weights, released by unloading it
        self.lock = SteeringLock(store, self.startup_name)
        self.leases = LeaseBook()  # clients' leases on the loaded model (kernel/model/leases.py)
        self._attachments_stale = (
            False  # another replica changed the attachments; see settle_attachments
        )
        self.beside = ModelsBeside(settings, models)  # a job's model beside the served one

    # what readiness, the views and the jobs read --------------------------------------------------
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
            return status_of(self.transition, self.slot.lm, self.last_name, self.errors)

    # requests -------------------------------------------------------------------------------------
    @property
    def resident(self) -> str | None:
        """The loaded model's name (None when none is)."""
        lm = self.slot.lm
        return lm.name if lm is not None else None

    def request_scope(self) -> AbstractContextManager:
        """Open around each HTTP request: the leases it takes are returned when it ends."""
        return request_scope(self.slot)

    async def acquire(self, name: str, may_load: bool = True) -> LoadedModel:
        """The model `name`, held by this request until it ends; when it is registered but not
        loaded, it is loaded first (on a worker thread), replacing the loaded model, unless the
        request forbade it (`may_load`: 409 model_not_resident). A bare repository name means its
        one registered quantisation (repo:QUANT)."""
        name = self.models.canonical(name)
        token = presented.get()
        lease = self._lease(name, token)
        if lease is None and not may_load:
            resident = repr(self.slot.lm.name) if self.slot.lm is not None else "none"
            raise ModelNotResident(
                f"model {name!r} is not loaded (the loaded model is {resident}) and "
                "X-miLLM-Load-Policy: refuse forbids loading it",
                param="model",
            )
        if lease is None:
            await in_passing_thread(self.load, name, token)
            lease = self._lease(name, token)
            if lease is None:  # an unload began right after the load
                raise ModelBusy(
                    f"model {name!r} is being unloaded; retry once it finishes", param="model"
                )
        return lease.lm

    def _lease(self, name: str, token: str | None):
        """A lease on `name` if it is loaded; None if it has to be loaded; else the refusal (on
        the event loop: memory only). A client's model lease is checked before the steering lock."""
        self.models.get(name, read_through=False)
        with self._mutex:
            if (leased := self.leases.refusal(self.resident, name, "load", token)) is not None:
                raise leased
            if (refusal := self.lock.refuses(name)) is not None:
                raise refusal
            lease = self.slot.lease(name)
            if lease is not None:
                return lease
            if (why := unleased(name, self.transition, self.errors)) is not None:
                raise why
        return None

    def submit(self, job) -> None:
        """Admit a job for the model this request holds (QueueFull at the bound; model_busy once
        that model stopped serving)."""
        lease = current_lease()
        if lease is None:
            raise RuntimeError("submit needs the model lease this request took with acquire()")
        if not self.slot.submit(lease, job):
            raise ModelBusy(
                f"model {lease.lm.name!r} is being unloaded; retry once it finishes", param="model"
            )

    def engine_for(self, name: str) -> str:
        """The engine that runs `name`: the loaded model's own, else the one a load would pick now
        (blocking: it reads the file's metadata), so a request can be refused before any load."""
        name = self.models.canonical(name)
        lm = self.slot.lm
        if lm is not None and lm.name == name:
            return lm.engine
        return loading.engine_for(self.settings, self.models, name, self._outgoing())

    # model changes --------------------------------------------------------------------------------
    def load(self, name: str, token: str | None = None) -> LoadedModel:
        """Make `name` the loaded model (blocking). Everything that can refuse runs before the
        loaded model is unloaded (a client's lease on it first, which `token` may lift); a
        failure after that is a 500 model_load_failed."""
        name = self.models.canonical(name)
        self.models.get(name)
        if (refusal := self.leases.refusal(self.resident, name, "load", token)) is not None:
            raise refusal
        if not self._switching.acquire(blocking=False):
            raise busy(self.transition)
        try:
            return self._switch(name, startup=False)
        finally:
            self._release_switching()

    def load_in_background(self) -> threading.Thread:
        """Start the start-up load without blocking the server's start; readiness reports
        progress."""
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

    def unload(self, name: str, token: str | None = None) -> bool:
        """Unload `name` if it is the loaded model (blocking, graceful; refused while a client
        leases it, unless `token` is the lease's id); returns whether it was loaded."""
        name = self.models.canonical(name)
        self.models.get(name)
        if (refusal := self.leases.refusal(self.resident, name, "unload", token)) is not None:
            raise refusal
        if not self._switching.acquire(blocking=False):
            raise busy(self.transition)
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
            if (refusal := self.lock.refuses(name)) is not None:
                raise refusal
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

    def _outgoing(self) -> Outgoing:
        lm = self.slot.lm
        return Outgoing(
            lm.name if lm else None, lm.device if lm else None, self._weights_bytes if lm else 0
        )

    def _replace(self, name: str, startup: bool) -> LoadedModel:
        outgoing = self._outgoing()
        source = self.source if startup else self.models.source(name)
        # --max-model-len is about the start-up model; a registered model keeps its own window.
        asked = self.settings.max_model_len if name == self.startup_name else None
        planned = loading.plan(self.settings, self.models, name, source, asked, outgoing)
        if outgoing.name is not None:
            self._unload(Transition(loading=name, unloading=outgoing.name))
            with self._mutex:
                self.transition = Transition(loading=name)
        with self._mutex:
            self.last_name = name
        try:
            lm = loading.load(self.settings, planned)
        except Exception as exc:  # out of memory, a bad file, ...: named, never a bare 500
            message = loading.failure(name, exc)
            log.error("model %r failed to load: %s", name, message)
            with self._mutex:
                self.errors[name] = message
            raise ModelLoadFailed(
                message + loading.unloaded_before(outgoing), param="model"
            ) from exc
        scheduler = loading.scheduler_for(self.settings, lm)
        if source.kind in ("demo", "packaged"):
            self.shipped.relocate(lm)  # before the restore: its attachment reads the shipped copy
            self.shipped.upgrade(lm)  # an earlier millm's shipped SAE makes way for this one's
        self.steering.restore(lm, self.registrations.sae_readable)
        if source.kind in ("demo", "packaged"):
            self.shipped.install(lm)
        if name == self.startup_name:
            self.startup_saes.attach(lm)
        with self._mutex:
            self.errors.pop(name, None)
            self._weights_bytes = planned.plan.needed
            if self.steering.attached:  # restored SAEs bind steering to this model
                self.lock.set(name)
            self.slot.fill(lm, scheduler)
        log.info("model %s loaded (%s)", lm.name, lm.system_fingerprint)
        return lm

    def _unload(self, transition: Transition) -> None:
        """Close the slot, let running requests finish, then free the model (see unloading.py)."""
        name = transition.unloading
        assert name is not None, "an unload names the model it unloads"
        with self._mutex:
            self.transition = transition
            self.last_name = name
        # stored attachments stay on unload: a reload of this model restores them
        retire(
            self.slot,
            name,
            self.settings.graceful_unload_timeout,
            before_free=self.steering.detach_all,
        )
        self.leases.model_left(name)
        with self._mutex:
            self._weights_bytes = 0

    # the steering lock ----------------------------------------------------------------------------
    @property
    def locked(self) -> str | None:
        """The model the server is locked to for steering, if any."""
        return self.lock.name

    def lock_to(self, name: str) -> None:
        """Serve only `name`: requests naming another model are refused, /v1/models lists only
        it."""
        self.models.get(name)
        with self._mutex:
            self.lock.lock(name)

    def unlock(self, name: str) -> bool:
        """Release the lock on `name`; refused while SAEs are attached (steering is bound to it)."""
        self.models.get(name)
        with self._mutex:
            attached = sorted(set(attachments(self.store)) | set(self.steering.attached))
            return self.lock.unlock(name, attached)

    # attachments ----------------------------------------------------------------------------------
    def attach_sae(self, sae_id: str, layer: int | None) -> Attached:
        """Attach an SAE to the loaded model and lock the server to that model (blocking)."""
        before = self.slot.lm
        if self.transition is not None or not self._switching.acquire(timeout=ATTACH_WAIT_S):
            raise busy(self.transition, param="sae_id")
        try:
            lm = self.slot.lm
            if lm is not before:
                raise ModelBusy(
                    "the loaded model changed while this attach waited; retry", param="sae_id"
                )
            if lm is None:  # what steering.attach would refuse first
                raise ModelNotLoaded("no model is loaded to attach an SAE to")
            attached = self.steering.attach(lm, sae_id, layer)
            with self._mutex:
                self.lock.set(lm.name)
            return attached
        finally:
            self._release_switching()

    def steering_changed(self) -> None:
        """Another replica changed the steering state: read it, then attach or detach here to match.
        Attaching loads an SAE (torch work), so it runs on a thread that ends with it, never on
        the long-lived listener thread (an idle OpenMP pool there would slow decoding; see
        threads.py)."""
        before = dict(self.steering.stored)
        self.steering.reload()
        if self.steering.stored == before and not self._attachments_stale:
            return
        self._attachments_stale = True
        worker = threading.Thread(
            target=self.settle_attachments, name="millm-attach-sync", daemon=True
        )
        worker.start()
        worker.join()

    def settle_attachments(self) -> None:
        """Bring this process's attachments in line with the stored ones, unless a model change
        holds the slot: whoever releases it next calls this again (a flag and a try-lock, so no
        change is missed and the notice thread never waits behind a model load)."""
        while self._attachments_stale and self._switching.acquire(blocking=False):
            try:
                self._attachments_stale = False
                lm = self.slot.lm
                self.steering.restore(lm, self.registrations.sae_readable)
                if lm is not None and self.steering.attached:
                    with self._mutex:
                        self.lock.set(lm.name)
            finally:
                self._switching.release()

    def _release_switching(self) -> None:
        """End a model change or an attach, then apply attachment changes that arrived meanwhile."""
        self._switching.release()
        self.settle_attachments()

    # the registered models' views -----------------------------------------------------------------
    def view(self, name: str) -> ModelView:
        """One registered model and its state (404 model_not_found if not registered)."""
        entry = self.models.get(name)
        with self._mutex:
            return view_of(entry, self.transition, self.slot.lm, self.errors, self.lock.name)

    def views(self) -> list[ModelView]:
        """Every registered model, oldest first."""
        entries = self.models.all()  # read before the mutex: it may read the store
        with self._mutex:
            return [
                view_of(e, self.transition, self.slot.lm, self.errors, self.lock.name)
                for e in entries
            ]

    def forget(self, name: str) -> None:
        """Delete a registration; refused (409) while it is loaded or moving, or locked."""
        self.models.get(name)
        with self._mutex:
            state = state_of(name, self.transition, self.slot.lm, self.errors)
            if (refusal := unforgettable(name, state, self.locked)) is not None:
                raise refusal
            self.models.forget(name)
            self.errors.pop(name, None)

    def close(self) -> None:
        """Stop the scheduler; queued requests are answered with an error."""
        scheduler = self.slot.scheduler
        if scheduler is not None:  # a thread that does not stop is logged; the process is ending
            scheduler.shutdown(timeout=unloading.SCHEDULER_STOP_S)
