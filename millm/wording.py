"""How counts read in the server's own sentences (job descriptions, messages)."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 feature`, `3 features` (`plural` for nouns that do not take an s)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
