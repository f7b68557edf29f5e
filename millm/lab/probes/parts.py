"""Which of the kernel's parts probes may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.probes.book import ProbeBook
from millm.kernel.runtime.jobs import JobBook
from millm.kernel.steering.live import Steering
from millm.kernel.steering.saes import SAERegistry
from millm.settings import Settings


class ProbeParts(Protocol):
    """The kernel's parts, as probes reach them."""

    @property
    def calibrations(self) -> CalibrationBook: ...

    @property
    def jobs(self) -> JobBook: ...

    @property
    def probes(self) -> ProbeBook: ...

    @property
    def saes(self) -> SAERegistry: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def steering(self) -> Steering: ...

    @property
    def switch(self) -> ModelSwitch: ...
