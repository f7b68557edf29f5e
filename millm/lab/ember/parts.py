"""Which of the kernel's parts the Ember routes may touch. The composition root hands the kernel's
whole state, and mypy checks there that it has these."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasCalibrations,
    HasLabels,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVariants,
)


class EmberParts(
    HasCalibrations,
    HasLabels,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVariants,
    Protocol,
):
    """The kernel's parts, as the Ember routes reach them: which SAE is attached, its labels and
    its calibration (Ember's units), and the model names requests use."""
