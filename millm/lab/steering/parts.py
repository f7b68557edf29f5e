"""Which of the kernel's parts steering may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasDecoders,
    HasPlanner,
    HasProfiles,
    HasRegistrations,
    HasSaes,
    HasSteering,
    HasStore,
    HasSwitch,
)


class SteeringParts(
    HasDecoders,
    HasPlanner,
    HasProfiles,
    HasRegistrations,
    HasSaes,
    HasSteering,
    HasStore,
    HasSwitch,
    Protocol,
):
    """The kernel's parts, as steering reach them."""
