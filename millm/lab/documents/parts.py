"""Which of the kernel's parts clusters and circuits may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasCircuits,
    HasClusters,
    HasPlanner,
    HasSettings,
    HasSteering,
    HasStore,
)


class DocumentParts(HasCircuits, HasClusters, HasPlanner, HasSteering, Protocol):
    """The kernel's parts, as clusters and circuits reach them."""


class ClaimParts(DocumentParts, HasSettings, HasStore, Protocol):
    """The kernel's parts, as circuits' claims reach them."""
