"""X-miLLM-Steering read back as the RFC 8941 list it is: each member's kind and parameters."""

from __future__ import annotations

import http_sfv

Member = tuple[str, dict[str, object]]


def members(header: str) -> list[Member]:
    """Every member of the header: (kind, parameters), tokens read as plain strings."""
    parsed = http_sfv.List()
    parsed.parse(header.encode())
    return [
        (str(entry.value), {key: _plain(value) for key, value in entry.params.items()})
        for entry in parsed
    ]


def member(header: str) -> Member:
    """The header's one member (an assertion error when it has several)."""
    found = members(header)
    assert len(found) == 1, f"expected one member in {header!r}"
    return found[0]


def kinds(header: str) -> list[str]:
    """The members' kinds, in order."""
    return [kind for kind, _ in members(header)]


def _plain(value: object) -> object:
    return str(value) if isinstance(value, http_sfv.Token) else value
