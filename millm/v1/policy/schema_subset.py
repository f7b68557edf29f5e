"""The JSON Schema subset millm enforces for structured output, checked before anything runs.

Constraint libraries compile some keywords without enforcing them, so the subset is millm's
own list. Every other keyword is refused, each named with its JSON pointer; the annotations
(title, description, default, examples) are accepted and ignored. Limits: 64 KB of schema,
nesting depth 32, 256 properties per object.
"""

from __future__ import annotations

import json

from millm.errors import ResponseFormatUnsupported

SUPPORTED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "$ref",
    "$defs",
}
ANNOTATIONS = {"title", "description", "default", "examples"}
TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
MAX_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_PROPERTIES = 256


# The subset as a JSON Schema, for the served OpenAPI schema (components/schemas/SchemaSubset).
# Contradictory bounds (a minimum above the maximum) and patterns the constraint library cannot
# compile pass it, and are refused when the schema is compiled.
SUBSET_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "type": {
            "anyOf": [
                {"enum": sorted(TYPES)},
                {"type": "array", "minItems": 1, "items": {"enum": sorted(TYPES)}},
            ]
        },
        "properties": {
            "type": "object",
            "maxProperties": MAX_PROPERTIES,
            "additionalProperties": {
                "anyOf": [{"type": "boolean"}, {"$ref": "#/components/schemas/SchemaSubset"}]
            },
        },
        "required": {"type": "array", "items": {"type": "string"}},
        "additionalProperties": {
            "anyOf": [{"type": "boolean"}, {"$ref": "#/components/schemas/SchemaSubset"}]
        },
        "items": {"anyOf": [{"type": "boolean"}, {"$ref": "#/components/schemas/SchemaSubset"}]},
        "minItems": {"type": "integer", "minimum": 0},
        "maxItems": {"type": "integer", "minimum": 0},
        "enum": {"type": "array", "minItems": 1},
        "const": {},
        "minimum": {"type": "number"},
        "maximum": {"type": "number"},
        "minLength": {"type": "integer", "minimum": 0},
        "maxLength": {"type": "integer", "minimum": 0},
        "pattern": {"type": "string", "format": "regex"},
        "anyOf": {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [{"type": "boolean"}, {"$ref": "#/components/schemas/SchemaSubset"}]
            },
        },
        "$ref": {"type": "string", "pattern": "^#/\\$defs/"},
        "$defs": {
            "type": "object",
            "additionalProperties": {
                "anyOf": [{"type": "boolean"}, {"$ref": "#/components/schemas/SchemaSubset"}]
            },
        },
        "title": {"type": "string"},
        "description": {"type": "string"},
        "default": {},
        "examples": {"type": "array"},
    },
}


def pointer(parts: list[str]) -> str:
    """A JSON pointer (RFC 6901) for the path parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts) or "/"


class _Walk:
    def __init__(self, root: dict):
        self.root = root
        self.unsupported: list[tuple[str, str]] = []
        self.problems: list[str] = []

    def schema(self, node, path: list[str], depth: int) -> None:
        if depth > MAX_DEPTH:
            self.problems.append(f"nesting deeper than {MAX_DEPTH} at {pointer(path)}")
            return
        if isinstance(node, bool):
            return  # true / false schemas are plain JSON Schema
        if not isinstance(node, dict):
            self.problems.append(f"{pointer(path)} is not a schema (an object or a boolean)")
            return
        for key, value in node.items():
            here = path + [key]
            if key in ANNOTATIONS:
                continue
            if key not in SUPPORTED:
                self.unsupported.append((key, pointer(here)))
                continue
            self.keyword(key, value, here, depth)

    def keyword(self, key: str, value, here: list[str], depth: int) -> None:
        if key == "type":
            names = value if isinstance(value, list) else [value]
            # {} in a list is no type name (and unhashable)
            bad = [n for n in names if not isinstance(n, str) or n not in TYPES]
            if bad or not names:
                self.problems.append(f"{pointer(here)}: unknown type {bad or value}")
        elif key == "properties":
            if not isinstance(value, dict):
                self.problems.append(f"{pointer(here)} must be an object")
                return
            if len(value) > MAX_PROPERTIES:
                self.problems.append(
                    f"{pointer(here)} has {len(value)} properties; at most {MAX_PROPERTIES}"
                )
            for name, sub in value.items():
                self.schema(sub, here + [name], depth + 1)
        elif key in ("additionalProperties", "items"):
            if key == "items" and isinstance(value, list):
                self.unsupported.append(("items (array form)", pointer(here)))
            elif not isinstance(value, bool):
                self.schema(value, here, depth + 1)
        elif key == "anyOf":
            if not isinstance(value, list) or not value:
                self.problems.append(f"{pointer(here)} must be a non-empty list")
                return
            for i, sub in enumerate(value):
                self.schema(sub, here + [str(i)], depth + 1)
        elif key == "$defs":
            if not isinstance(value, dict):
                self.problems.append(f"{pointer(here)} must be an object")
                return
            for name, sub in value.items():
                self.schema(sub, here + [name], depth + 1)
        elif key == "$ref":
            self.reference(value, here)
        elif key == "required" and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            self.problems.append(f"{pointer(here)} must be a list of property names")
        elif key == "enum" and not isinstance(value, list):
            self.problems.append(f"{pointer(here)} must be a list")
        elif key == "pattern" and not isinstance(value, str):
            self.problems.append(f"{pointer(here)} must be a string")

    def reference(self, value, here: list[str]) -> None:
        # Only local references into $defs: a remote one would fetch a schema from elsewhere.
        if not isinstance(value, str) or not value.startswith("#/$defs/"):
            self.unsupported.append(("$ref (not a local #/$defs/ reference)", pointer(here)))
            return
        name = value[len("#/$defs/") :].replace("~1", "/").replace("~0", "~")
        if name not in (self.root.get("$defs") or {}):
            self.problems.append(f"{pointer(here)}: {value} names no entry of $defs")


def check_schema(schema, param: str = "response_format") -> None:
    """Refuse (400 response_format_unsupported, naming `param`) a schema outside the subset or
    its limits."""
    size = len(json.dumps(schema))
    if size > MAX_BYTES:
        raise ResponseFormatUnsupported(
            f"{param}: the schema is {size} bytes; at most {MAX_BYTES}", param
        )
    if not isinstance(schema, dict):
        what = "json_schema.schema" if param == "response_format" else "the schema"
        raise ResponseFormatUnsupported(f"{param}: {what} must be an object", param)
    walk = _Walk(schema)
    walk.schema(schema, [], 1)
    if walk.unsupported:
        listed = ", ".join(f"{keyword} at {where}" for keyword, where in walk.unsupported)
        raise ResponseFormatUnsupported(
            f"{param}: unsupported JSON Schema keywords: {listed}", param
        )
    if walk.problems:
        raise ResponseFormatUnsupported(
            f"{param}: invalid schema: " + "; ".join(walk.problems), param
        )
