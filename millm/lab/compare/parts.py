"""Which of the kernel's parts compare may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.documents import CircuitBook, ClusterBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.steering.plans import Planner
from millm.settings import Settings


class CompareParts(Protocol):
    """The kernel's parts, as compare reach them."""

    @property
    def circuits(self) -> CircuitBook: ...

    @property
    def clusters(self) -> ClusterBook: ...

    @property
    def planner(self) -> Planner: ...

    @property
    def profiles(self) -> ProfileBook: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def switch(self) -> ModelSwitch: ...
