"""Which of the kernel's parts steered variants may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.books.profiles import ProfileBook
from millm.kernel.model.registry import ModelRegistry
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.variants.naming import VariantRouting


class VariantParts(Protocol):
    """The kernel's parts, as steered variants reach them."""

    @property
    def models(self) -> ModelRegistry: ...

    @property
    def profiles(self) -> ProfileBook: ...

    @property
    def switch(self) -> ModelSwitch: ...

    @property
    def variants(self) -> VariantRouting: ...
