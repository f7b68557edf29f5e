"""Which of the kernel's parts model administration may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasPlanner,
    HasRegistrations,
    HasReplication,
    HasSettings,
    HasStore,
    HasSwitch,
)


class ModelParts(
    HasPlanner, HasRegistrations, HasReplication, HasSettings, HasStore, HasSwitch, Protocol
):
    """The kernel's parts, as model administration reach them."""
