"""Which of the kernel's parts the /v1 generation routes may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasCalibrations,
    HasLabels,
    HasMonitor,
    HasPlanner,
    HasProbes,
    HasProfiles,
    HasSensing,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVariants,
)


class ServingParts(
    HasCalibrations,
    HasLabels,
    HasMonitor,
    HasPlanner,
    HasProbes,
    HasProfiles,
    HasSensing,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVariants,
    Protocol,
):
    """The kernel's parts, as the /v1 generation routes reach them."""
