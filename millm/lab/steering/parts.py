"""Which of the kernel's parts steering may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.profiles import ProfileBook
from millm.kernel.model.registrations import ClientRegistrations
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.steering.decoders import DecoderCache
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner
from millm.kernel.steering.saes import SAERegistry
from millm.store.database import Store


class SteeringParts(Protocol):
    """The kernel's parts, as steering reach them."""

    @property
    def decoders(self) -> DecoderCache: ...

    @property
    def planner(self) -> Planner: ...

    @property
    def profiles(self) -> ProfileBook: ...

    @property
    def registrations(self) -> ClientRegistrations: ...

    @property
    def saes(self) -> SAERegistry: ...

    @property
    def steering(self) -> Steering: ...

    @property
    def store(self) -> Store: ...

    @property
    def switch(self) -> ModelSwitch: ...
