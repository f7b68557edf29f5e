"""Which of the kernel's parts steered variants may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasModels, HasProfiles, HasSwitch, HasVariants


class VariantParts(HasModels, HasProfiles, HasSwitch, HasVariants, Protocol):
    """The kernel's parts, as steered variants reach them."""
