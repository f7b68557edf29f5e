"""Which of the kernel's parts model administration may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.model.registrations import ClientRegistrations
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.runtime.replication import Replication
from millm.kernel.steering.plans import Planner
from millm.settings import Settings


class ModelParts(Protocol):
    """The kernel's parts, as model administration reach them."""

    @property
    def planner(self) -> Planner: ...

    @property
    def registrations(self) -> ClientRegistrations: ...

    @property
    def replication(self) -> Replication: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def switch(self) -> ModelSwitch: ...
