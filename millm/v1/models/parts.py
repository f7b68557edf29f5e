"""Which of the kernel's parts /v1/models may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasSwitch, HasVariants


class ListingParts(HasSwitch, HasVariants, Protocol):
    """The kernel's parts, as /v1/models reach them."""
