"""One Protocol per part of the kernel's state: a folder's parts.py names the parts it may touch
by combining these, so each part is declared once."""

from __future__ import annotations

from typing import Protocol

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


class HasSettings(Protocol):
    """A holder of the settings."""

    @property
    def settings(self) -> Settings: ...


class HasStore(Protocol):
    """A holder of the store."""

    @property
    def store(self) -> Store: ...


class HasReplication(Protocol):
    """A holder of the replication."""

    @property
    def replication(self) -> Replication: ...


class HasLabels(Protocol):
    """A holder of the labels."""

    @property
    def labels(self) -> LabelBook: ...


class HasSaes(Protocol):
    """A holder of the saes."""

    @property
    def saes(self) -> SAERegistry: ...


class HasDecoders(Protocol):
    """A holder of the decoders."""

    @property
    def decoders(self) -> DecoderCache: ...


class HasProfiles(Protocol):
    """A holder of the profiles."""

    @property
    def profiles(self) -> ProfileBook: ...


class HasProbes(Protocol):
    """A holder of the probes."""

    @property
    def probes(self) -> ProbeBook: ...


class HasVectors(Protocol):
    """A holder of the vectors."""

    @property
    def vectors(self) -> VectorBook: ...


class HasCalibrations(Protocol):
    """A holder of the calibrations."""

    @property
    def calibrations(self) -> CalibrationBook: ...


class HasSteering(Protocol):
    """A holder of the steering."""

    @property
    def steering(self) -> Steering: ...


class HasClusters(Protocol):
    """A holder of the clusters."""

    @property
    def clusters(self) -> ClusterBook: ...


class HasCircuits(Protocol):
    """A holder of the circuits."""

    @property
    def circuits(self) -> CircuitBook: ...


class HasPlanner(Protocol):
    """A holder of the planner."""

    @property
    def planner(self) -> Planner: ...


class HasVariants(Protocol):
    """A holder of the variants."""

    @property
    def variants(self) -> VariantRouting: ...


class HasMonitor(Protocol):
    """A holder of the monitor."""

    @property
    def monitor(self) -> Monitor: ...


class HasSensing(Protocol):
    """A holder of sensing."""

    @property
    def sensing(self) -> Sensing: ...


class HasModels(Protocol):
    """A holder of the models."""

    @property
    def models(self) -> ModelRegistry: ...


class HasRegistrations(Protocol):
    """A holder of the registrations."""

    @property
    def registrations(self) -> ClientRegistrations: ...


class HasSwitch(Protocol):
    """A holder of the switch."""

    @property
    def switch(self) -> ModelSwitch: ...


class HasJobs(Protocol):
    """A holder of the jobs."""

    @property
    def jobs(self) -> JobBook: ...


class HasTranscoders(Protocol):
    """A holder of the transcoders."""

    @property
    def transcoders(self) -> TranscoderBook: ...
