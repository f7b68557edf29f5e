"""The imported documents' formats as JSON Schema, for the served OpenAPI schema.

The validators in profiles.py and mistudio.py are what the server applies (they list every
problem with its location); these schemas say the same for clients and generators, built from
the validators' own constants. What JSON Schema cannot say is left to the validators: names
unique within a bundle, feature indices unique within an entry, an SAE named once per profile,
and `lo <= hi` in an intensity range. The fuzz test checks that what these schemas allow, the
validators accept.
"""

from __future__ import annotations

from millm.interp.mistudio import CIRCUIT_KIND, CLUSTER_BUNDLE_KIND, CLUSTER_KIND, SCHEMA_VERSION
from millm.interp.profiles import BUNDLE_KIND, MAX_BUNDLE, MAX_DESCRIPTION, NAME, PROFILE_KIND, VERSION
from millm.interp.steering import STRENGTH_LIMIT

NON_NEGATIVE = {"type": "integer", "minimum": 0}
NULL = {"type": "null"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, NULL]}


PROFILE_FEATURE = {
    "type": "object",
    "required": ["index", "strength"],
    "properties": {"index": NON_NEGATIVE, "strength": {"type": "number", "minimum": -STRENGTH_LIMIT, "maximum": STRENGTH_LIMIT}},
}
PROFILE_ENTRY = {
    "type": "object",
    "required": ["sae_id", "features"],
    "properties": {
        "sae_id": {"type": "string", "minLength": 1},
        "layer": _nullable(NON_NEGATIVE),
        "features": {"type": "array", "items": PROFILE_FEATURE},
    },
}
PROFILE_DOCUMENT = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "kind": {"const": PROFILE_KIND},
        "version": {"const": VERSION},
        "name": {"type": "string", "pattern": NAME.pattern},
        "description": {"type": "string", "maxLength": MAX_DESCRIPTION},
        "steering": {"type": "array", "items": PROFILE_ENTRY},
    },
}
PROFILE_BUNDLE = {
    "type": "object",
    "required": ["kind", "profiles"],
    "properties": {
        "kind": {"const": BUNDLE_KIND},
        "version": {"const": VERSION},
        "profiles": {"type": "array", "minItems": 1, "maxItems": MAX_BUNDLE, "items": PROFILE_DOCUMENT},
    },
}

MEMBER = {
    "type": "object",
    "required": ["feature_idx", "strength"],
    "properties": {
        "feature_idx": NON_NEGATIVE,
        "strength": {"type": "number", "minimum": -300, "maximum": 300},
        "sign": {"enum": [1, -1]},
        "similarity": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "pinned": _nullable({"type": "boolean"}),
        "meta": _nullable({"type": "object", "properties": {"top_tokens": _nullable({"type": "array", "maxItems": 10})}}),
    },
}
SAE_REFERENCE = {
    "type": "object",
    "properties": {
        "layer": _nullable(NON_NEGATIVE),
        "n_features": _nullable(NON_NEGATIVE),
        "d_model": _nullable(NON_NEGATIVE),
        "source_hint": _nullable({"type": "string", "pattern": "^hf:"}),
    },
}
BUDGET = {
    "type": "object",
    "properties": {
        "intensity": {"type": "number", "minimum": 0, "maximum": 2},
        "intensity_range": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number", "minimum": 0}},
    },
}


def _header(kind: str) -> dict:
    return {
        "kind": {"const": kind},
        "schema_version": {"const": SCHEMA_VERSION},
        "name": {"type": "string", "minLength": 1, "maxLength": 120},
        "narrative": _nullable({"type": "string", "maxLength": 10_000}),
        "model": _nullable({"type": "object"}),
        "provenance": _nullable({"type": "object", "properties": {"source_note": _nullable({"type": "string", "maxLength": 500})}}),
    }


CLUSTER_DEFINITION = {
    "type": "object",
    "required": ["kind", "schema_version", "name", "members"],
    "properties": {
        **_header(CLUSTER_KIND),
        "sae": SAE_REFERENCE,
        "members": {"type": "array", "minItems": 1, "maxItems": 20, "items": MEMBER},
        "budget": _nullable(BUDGET),
    },
}
CLUSTER_BUNDLE = {
    "type": "object",
    "required": ["kind", "schema_version", "definitions"],
    "properties": {
        "kind": {"const": CLUSTER_BUNDLE_KIND},
        "schema_version": {"const": SCHEMA_VERSION},
        "definitions": {"type": "array", "minItems": 1, "maxItems": 50, "items": CLUSTER_DEFINITION},
    },
}
CIRCUIT_MEMBER = {"anyOf": [
    {"type": "object", "required": ["layer", "feature"], "properties": {
        "layer": NON_NEGATIVE, "member_kind": {"const": "feature_ref"}, "feature": MEMBER}},
    {"type": "object", "required": ["layer", "member_kind", "expanded_members"], "properties": {
        "layer": NON_NEGATIVE, "member_kind": {"const": "cluster_ref"},
        "expanded_members": {"type": "array", "minItems": 1, "maxItems": 20, "items": MEMBER}}},
]}
EDGE = {
    "type": "object",
    "required": ["up", "down"],
    "properties": {
        "up": {"type": "object"},
        "down": {"type": "object"},
        "rung": {"enum": [0, 1, 2, 3]},
        "type": _nullable({"enum": ["computed", "persistence", "attention_mediated"]}),
    },
}
CIRCUIT_DEFINITION = {
    "type": "object",
    "required": ["kind", "schema_version", "name", "saes", "members"],
    "properties": {
        **_header(CIRCUIT_KIND),
        "saes": {"type": "array", "minItems": 1, "maxItems": 16,
                 "items": {**SAE_REFERENCE, "required": ["layer"], "properties": {**SAE_REFERENCE["properties"], "layer": NON_NEGATIVE}}},
        "members": {"type": "array", "minItems": 1, "items": CIRCUIT_MEMBER},
        "edges": {"type": "array", "maxItems": 200, "items": EDGE},
        "budget": _nullable({**BUDGET, "properties": {**BUDGET["properties"], "layers": _nullable({"type": "object", "additionalProperties": _nullable(BUDGET)})}}),
    },
}

# Component name -> schema, for the served OpenAPI schema.
SCHEMAS = {
    "ProfileDocument": PROFILE_DOCUMENT,
    "ProfileBundle": PROFILE_BUNDLE,
    "ClusterDefinition": CLUSTER_DEFINITION,
    "ClusterBundle": CLUSTER_BUNDLE,
    "CircuitDefinition": CIRCUIT_DEFINITION,
}
