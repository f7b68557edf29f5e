"""ServerState: the one owner of the server's mutable state (the model slot and its scheduler)."""

from __future__ import annotations

import logging
import threading
import time
from enum import Enum

from millm.engine.loader import LoadedModel, load_model
from millm.engine.scheduler import Scheduler
from millm.engine.sources import ModelSource
from millm.errors import ModelNotFound, ModelNotLoaded, ModelSourceError
from millm.service.documents import CircuitBook, ClusterBook
from millm.service.plans import DialLimits, Planner
from millm.service.profiles import ProfileBook
from millm.service.saes import SAERegistry
from millm.service.steering import Steering
from millm.settings import Settings
from millm.store.database import Store, database_url

log = logging.getLogger(__name__)


class ModelStatus(str, Enum):
    """Where the served model is in its life."""

    LOADING = "loading"
    LOADED = "loaded"
    ERROR = "error"


class ServerState:
    """Holds the model slot and the steering state; the API asks it for both and submits jobs through it."""

    def __init__(self, settings: Settings, source: ModelSource):
        self.settings = settings
        self.source = source
        settings.home.mkdir(parents=True, exist_ok=True)
        self.store = Store(database_url(settings.home, settings.database_url))
        self.saes = SAERegistry(self.store, settings.hub_dir)
        self.profiles = ProfileBook(self.store)
        self.steering = Steering(self.store, self.saes, self.profiles)
        self.clusters = ClusterBook(self.store, settings.steering_intensity_max)
        self.circuits = CircuitBook(self.store)
        limits = DialLimits(settings.cluster_intensity_min, settings.circuit_intensity_min, settings.steering_intensity_max)
        self.planner = Planner(self.steering, self.clusters, self.circuits, limits)
        self.expected_name = settings.served_model_name or source.name
        self.created = int(time.time())
        self.status = ModelStatus.LOADING
        self.load_error: str | None = None
        self.lm: LoadedModel | None = None
        self.scheduler: Scheduler | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the configured model (blocking); on failure the state records why."""
        try:
            lm = load_model(
                self.source,
                dtype=self.settings.dtype,
                device=self.settings.device,
                cache_root=self.settings.cache_dir,
                max_model_len=self.settings.max_model_len,
                served_name=self.settings.served_model_name,
            )
        except ModelSourceError as exc:
            log.error("model %r failed to load: %s", self.source.reference, exc)
            with self._lock:
                self.status, self.load_error = ModelStatus.ERROR, str(exc)
            return
        scheduler = Scheduler(
            lm,
            self.settings.max_pending_requests,
            batching=self.settings.enable_continuous_batching,
            max_batch=self.settings.max_batch_size,
        )
        self.steering.restore(lm)
        if self.source.kind == "demo":
            from millm.service.demo import install_demo

            install_demo(self, lm)
        with self._lock:
            self.lm, self.scheduler, self.status = lm, scheduler, ModelStatus.LOADED
        log.info("model %s loaded (%s)", lm.name, lm.system_fingerprint)

    def load_in_background(self) -> threading.Thread:
        """Start loading without blocking the server's start; readiness reports progress."""
        thread = threading.Thread(target=self.load, name="millm-model-load", daemon=True)
        thread.start()
        return thread

    def model_for(self, name: str) -> LoadedModel:
        """The loaded model if `name` is it; 404 for names the server does not know, 503 while not loaded."""
        if name != self.expected_name:
            raise ModelNotFound(
                f"The model {name!r} does not exist on this server; it serves {self.expected_name!r}",
                param="model",
            )
        if self.lm is None:
            detail = f": {self.load_error}" if self.load_error else " yet; retry once it has loaded"
            raise ModelNotLoaded(f"model {name!r} is not loaded{detail}", param="model")
        return self.lm

    def submit(self, job) -> None:
        """Admit a job to the scheduler (QueueFull when the queue is at its bound)."""
        if self.scheduler is None:
            raise ModelNotLoaded("no model is loaded")
        self.scheduler.submit(job)

    def close(self) -> None:
        """Stop the scheduler; queued requests are answered with an error."""
        if self.scheduler is not None:
            self.scheduler.shutdown(timeout=30)
        self.store.close()
