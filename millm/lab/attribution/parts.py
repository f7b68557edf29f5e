"""Which of the kernel's parts attribution graphs may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasCircuits,
    HasJobs,
    HasPlanner,
    HasProfiles,
    HasRegistrations,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasTranscoders,
)


class AttributionParts(
    HasCircuits,
    HasJobs,
    HasPlanner,
    HasProfiles,
    HasRegistrations,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasTranscoders,
    Protocol,
):
    """The kernel's parts, as attribution graphs reach them."""
