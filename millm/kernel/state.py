"""What every capability shares: the kernel's parts, one of each, and how they close."""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.sources import ModelSource
from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.books.documents import CircuitBook, ClusterBook
from millm.kernel.books.labels import LabelBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.books.transcoders import TranscoderBook
from millm.kernel.books.vectors import VectorBook
from millm.kernel.model.registrations import ClientRegistrations
from millm.kernel.model.registry import ModelRegistry
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.monitoring.monitor import Monitor
from millm.kernel.probes.book import ProbeBook
from millm.kernel.runtime.jobs import JobBook
from millm.kernel.runtime.replication import Replication
from millm.kernel.sensing.sensing import Sensing
from millm.kernel.steering.decoders import DecoderCache
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner
from millm.kernel.steering.saes import SAERegistry
from millm.kernel.variants.naming import VariantRouting
from millm.settings import Settings
from millm.store.database import Store
from millm.store.single_process import SqliteClaim


@dataclass(frozen=True)
class ServerState:
    """The kernel's parts, made once by the composition root (server/composition.py) in
    dependency order; the capabilities' services are built over them."""

    settings: Settings
    source: ModelSource
    claim: SqliteClaim
    store: Store
    replication: Replication
    labels: LabelBook
    saes: SAERegistry
    decoders: DecoderCache
    profiles: ProfileBook
    probes: ProbeBook
    vectors: VectorBook
    calibrations: CalibrationBook
    steering: Steering
    clusters: ClusterBook
    circuits: CircuitBook
    planner: Planner
    variants: VariantRouting
    monitor: Monitor
    sensing: Sensing
    models: ModelRegistry
    registrations: ClientRegistrations
    switch: ModelSwitch
    jobs: JobBook
    transcoders: TranscoderBook

    def close(self) -> None:
        """Stop the jobs and the scheduler (queued requests are answered with an error), then the
        store."""
        self.jobs.cancel_all()
        self.switch.close()
        self.monitor.close()
        self.sensing.close()
        self.replication.close()
        self.store.close()
        self.claim.release()
