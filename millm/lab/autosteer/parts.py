"""Which of the kernel's parts AutoSteer's search may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasJobs,
    HasLabels,
    HasPlanner,
    HasProfiles,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
)


class AutoSteerParts(
    HasJobs,
    HasLabels,
    HasPlanner,
    HasProfiles,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    Protocol,
):
    """The kernel's parts, as AutoSteer's search reach them."""
