"""Which of the kernel's parts steering evaluations may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasJobs,
    HasPlanner,
    HasProfiles,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVariants,
    HasVectors,
)


class EvaluationParts(
    HasJobs,
    HasPlanner,
    HasProfiles,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVariants,
    HasVectors,
    Protocol,
):
    """The kernel's parts, as steering evaluations reach them."""
