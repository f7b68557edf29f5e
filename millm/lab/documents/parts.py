"""Which of the kernel's parts clusters and circuits may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.documents import CircuitBook, ClusterBook
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner


class DocumentParts(Protocol):
    """The kernel's parts, as clusters and circuits reach them."""

    @property
    def circuits(self) -> CircuitBook: ...

    @property
    def clusters(self) -> ClusterBook: ...

    @property
    def planner(self) -> Planner: ...

    @property
    def steering(self) -> Steering: ...
