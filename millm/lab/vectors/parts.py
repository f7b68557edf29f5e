"""Which of the kernel's parts steering vectors may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.labels import LabelBook
from millm.kernel.books.vectors import VectorBook
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.runtime.jobs import JobBook
from millm.kernel.steering.decoders import DecoderCache
from millm.kernel.steering.live import Steering
from millm.kernel.steering.saes import SAERegistry
from millm.settings import Settings


class VectorParts(Protocol):
    """The kernel's parts, as steering vectors reach them."""

    @property
    def decoders(self) -> DecoderCache: ...

    @property
    def jobs(self) -> JobBook: ...

    @property
    def labels(self) -> LabelBook: ...

    @property
    def saes(self) -> SAERegistry: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def steering(self) -> Steering: ...

    @property
    def switch(self) -> ModelSwitch: ...

    @property
    def vectors(self) -> VectorBook: ...
