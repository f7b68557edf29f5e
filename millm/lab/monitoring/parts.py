"""Which of the kernel's parts monitoring may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasMonitor, HasSaes, HasSteering


class MonitoringParts(HasMonitor, HasSaes, HasSteering, Protocol):
    """The kernel's parts, as monitoring reach them."""
