"""Which of the kernel's parts discovery's reads may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasPlanner, HasProfiles, HasSaes, HasSettings, HasSteering, HasSwitch


class DiscoveryParts(
    HasPlanner, HasProfiles, HasSaes, HasSettings, HasSteering, HasSwitch, Protocol
):
    """The kernel's parts, as discovery's reads reach them."""
