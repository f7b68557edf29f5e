"""Small JSON Schema builders for the served OpenAPI schema's cross-field rules.

Each module that enforces a rule across fields (field_policy, scoring, structured, protocol)
states it next to its check with these builders; server/openapi.py puts the statements in the
served schema, and the fuzz test (tests/api/test_fuzz_openapi.py) checks that what the schema
allows the server accepts.
"""

from __future__ import annotations

from typing import Any

NULL = {"type": "null"}


def sent(field: str) -> dict:
    """`field` is present and not null."""
    return {"required": [field], "properties": {field: {"not": NULL}}}


def equals(field: str, value: Any) -> dict:
    """`field` is present with this value."""
    return {"required": [field], "properties": {field: {"const": value}}}


def one_of_values(field: str, values: list) -> dict:
    """`field` is absent, or one of these values."""
    return {"properties": {field: {"enum": values}}}


def absent_or_null(field: str) -> dict:
    """`field` is not sent, or sent as null."""
    return {"properties": {field: NULL}}


def at_most(field: str, value: int) -> dict:
    """`field` is absent, null, or a number no larger than `value`."""
    return {"properties": {field: {"anyOf": [NULL, {"type": "number", "maximum": value}]}}}


def when(condition: dict, then: dict) -> dict:
    """If `condition` holds, so must `then`."""
    return {"if": condition, "then": then}


def any_of(*conditions: dict) -> dict:
    """At least one of the conditions."""
    return {"anyOf": list(conditions)}


def nullable(schema: dict) -> dict:
    """`schema`, or null."""
    return {"anyOf": [schema, NULL]}
