"""Which of the kernel's parts the tokenizer routes may touch. The composition root hands the
kernel's whole state, and mypy checks there that it has these; a function here can reach no
other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.model.switch import ModelSwitch
from millm.kernel.variants.naming import VariantRouting


class TokenizerParts(Protocol):
    """The kernel's parts, as the tokenizer routes reach them."""

    @property
    def switch(self) -> ModelSwitch: ...

    @property
    def variants(self) -> VariantRouting: ...
