"""Which of the kernel's parts attribution graphs may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.documents import CircuitBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.books.transcoders import TranscoderBook
from millm.kernel.model.registrations import ClientRegistrations
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.runtime.jobs import JobBook
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner
from millm.kernel.steering.saes import SAERegistry
from millm.settings import Settings


class AttributionParts(Protocol):
    """The kernel's parts, as attribution graphs reach them."""

    @property
    def circuits(self) -> CircuitBook: ...

    @property
    def jobs(self) -> JobBook: ...

    @property
    def planner(self) -> Planner: ...

    @property
    def profiles(self) -> ProfileBook: ...

    @property
    def registrations(self) -> ClientRegistrations: ...

    @property
    def saes(self) -> SAERegistry: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def steering(self) -> Steering: ...

    @property
    def switch(self) -> ModelSwitch: ...

    @property
    def transcoders(self) -> TranscoderBook: ...
