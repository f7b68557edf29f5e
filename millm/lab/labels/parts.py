"""Which of the kernel's parts labels and their explaining may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasCalibrations,
    HasDecoders,
    HasJobs,
    HasLabels,
    HasPlanner,
    HasProfiles,
    HasRegistrations,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
)


class LabelParts(
    HasCalibrations,
    HasDecoders,
    HasJobs,
    HasLabels,
    HasPlanner,
    HasProfiles,
    HasRegistrations,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    Protocol,
):
    """The kernel's parts, as labels and their explaining reach them."""
