"""Which of the kernel's parts the /v1 generation routes may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.books.labels import LabelBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.monitoring.monitor import Monitor
from millm.kernel.probes.book import ProbeBook
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner
from millm.kernel.variants.naming import VariantRouting
from millm.settings import Settings


class ServingParts(Protocol):
    """The kernel's parts, as the /v1 generation routes reach them."""

    @property
    def calibrations(self) -> CalibrationBook: ...

    @property
    def labels(self) -> LabelBook: ...

    @property
    def monitor(self) -> Monitor: ...

    @property
    def planner(self) -> Planner: ...

    @property
    def probes(self) -> ProbeBook: ...

    @property
    def profiles(self) -> ProfileBook: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def steering(self) -> Steering: ...

    @property
    def switch(self) -> ModelSwitch: ...

    @property
    def variants(self) -> VariantRouting: ...
