"""Which of the kernel's parts monitoring may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.monitoring.monitor import Monitor
from millm.kernel.steering.live import Steering
from millm.kernel.steering.saes import SAERegistry


class MonitoringParts(Protocol):
    """The kernel's parts, as monitoring reach them."""

    @property
    def monitor(self) -> Monitor: ...

    @property
    def saes(self) -> SAERegistry: ...

    @property
    def steering(self) -> Steering: ...
