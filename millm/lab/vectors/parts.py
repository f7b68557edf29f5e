"""Which of the kernel's parts steering vectors may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import (
    HasDecoders,
    HasJobs,
    HasLabels,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVectors,
)


class VectorParts(
    HasDecoders,
    HasJobs,
    HasLabels,
    HasSaes,
    HasSettings,
    HasSteering,
    HasSwitch,
    HasVectors,
    Protocol,
):
    """The kernel's parts, as steering vectors reach them."""
