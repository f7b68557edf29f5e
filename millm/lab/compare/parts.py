"""Which of the kernel's parts compare may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasCircuits,
    HasClusters,
    HasPlanner,
    HasProfiles,
    HasSettings,
    HasSwitch,
)


class CompareParts(
    HasCircuits, HasClusters, HasPlanner, HasProfiles, HasSettings, HasSwitch, Protocol
):
    """The kernel's parts, as compare reach them."""
