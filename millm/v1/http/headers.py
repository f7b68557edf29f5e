"""The X-miLLM-* response headers, serialised as RFC 8941 structured fields (through http-sfv)."""

from __future__ import annotations

import http_sfv

from millm.errors import InvalidRequest
from millm.v1.policy.field_policy import (
    percent_encode,
)  # one encoding for every name a header carries

STRICT_HEADER = "X-miLLM-Strict"
LOAD_POLICY_HEADER = "X-miLLM-Load-Policy"


def item(value, **params) -> str:
    """One RFC 8941 item with parameters, e.g. 7;scope="request" or live;version=3."""
    entry = http_sfv.Item(_printable(value))
    for key, param in params.items():
        entry.params[key] = _printable(param)
    return str(entry)


def _printable(value):
    # RFC 8941 strings hold printable ASCII only, and a cluster's or circuit's name may hold
    # anything: such characters are percent-encoded, as field names are (tokens are left as is).
    return percent_encode(value) if type(value) is str else value


def members(entries: list[tuple[str, dict[str, object]]], encoded: frozenset[str]) -> str:
    """An RFC 8941 list of token items with parameters (X-miLLM-Steering's members); True is a
    bare boolean, a str subclass marked as a token a token, and the string parameters named in
    `encoded` have `"` and `\\` percent-encoded too, as the original miLLM writes a name."""
    values = http_sfv.List()
    for kind, params in entries:
        entry = http_sfv.Item(http_sfv.Token(kind))
        for key, value in params.items():
            if type(value) is not str and isinstance(value, str):
                entry.params[key] = http_sfv.Token(value)
            elif key in encoded and isinstance(value, str):
                entry.params[key] = percent_encode(value, also='"\\')
            else:
                entry.params[key] = _printable(value)
        values.append(entry)
    return str(values)


def token(value: str, **params) -> str:
    """An item whose value is a bare token (live, none, profile)."""
    return item(http_sfv.Token(value), **params)


def seed_header(seed: int, scope: str) -> str:
    """X-miLLM-Seed: 7;scope="request"."""
    return item(seed, scope=scope)


def string_list(entries: list[str], cap: int) -> str | None:
    """An RFC 8941 list of strings no longer than `cap` bytes; past it, the last entry is "+N
    more"."""
    if not entries:
        return None
    kept: list[str] = []
    for i, entry in enumerate(entries):
        rest = len(entries) - i - 1
        candidate = kept + [entry] + ([f"+{rest} more"] if rest else [])
        if len(_serialise(candidate)) <= cap:
            kept.append(entry)
            continue
        # This entry does not fit with a "+N more" after it: stop and say how many were left out.
        omitted = len(entries) - len(kept)
        while kept and len(_serialise(kept + [f"+{omitted} more"])) > cap:
            kept.pop()
            omitted += 1
        return _serialise(kept + [f"+{omitted} more"])
    return _serialise(kept)


def _serialise(entries: list[str]) -> str:
    values = http_sfv.List()
    values.extend(http_sfv.Item(entry) for entry in entries)
    return str(values)


def may_load(value: str | None) -> bool:
    """X-miLLM-Load-Policy: auto/absent -> a request naming a model that is not loaded loads it;
    refuse -> it is refused instead (409 model_not_resident); anything else is a 400 naming the
    header."""
    if value is None or value.strip().lower() == "auto":
        return True
    if value.strip().lower() == "refuse":
        return False
    raise InvalidRequest(
        f"{LOAD_POLICY_HEADER} must be auto or refuse, got {value!r}",
        param=LOAD_POLICY_HEADER,
        code="invalid_header",
    )


def strict_mode(value: str | None) -> bool:
    """X-miLLM-Strict: true/1 -> strict, false/0/absent -> report; anything else is a 400 naming
    the header."""
    if value is None:
        return False
    normalised = value.strip().lower()
    if normalised in ("true", "1"):
        return True
    if normalised in ("false", "0"):
        return False
    raise InvalidRequest(
        f"{STRICT_HEADER} must be true, 1, false or 0, got {value!r}",
        param=STRICT_HEADER,
        code="invalid_header",
    )
