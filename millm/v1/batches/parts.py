"""Which of the kernel's parts the batches may touch. The composition root hands the kernel's
whole state, and mypy checks there that it has these; a function here can reach no other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasReplication, HasSettings, HasStore, HasSwitch, HasVariants


class BatchParts(HasReplication, HasSettings, HasStore, HasSwitch, HasVariants, Protocol):
    """The kernel's parts, as the batches reach them."""
