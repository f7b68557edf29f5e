"""Which of the kernel's parts probes may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasCalibrations,
    HasJobs,
    HasProbes,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
)


class ProbeParts(
    HasCalibrations, HasJobs, HasProbes, HasSaes, HasSettings, HasSteering, HasSwitch, Protocol
):
    """The kernel's parts, as probes reach them."""
