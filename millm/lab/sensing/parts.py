"""Which of the kernel's parts sensing may touch. The composition root hands the kernel's whole
state, and mypy checks there that it has these; a function here can reach no other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasPlanner, HasSensing, HasSettings, HasStore


class SensingParts(HasPlanner, HasSensing, HasSettings, HasStore, Protocol):
    """The kernel's parts, as sensing reaches them."""
