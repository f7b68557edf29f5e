"""The imported documents' models as JSON Schema, for the served OpenAPI schema (nested models
are components too) and for request fields that embed a document."""

from __future__ import annotations

from pydantic.json_schema import models_json_schema

from millm.formats.document_schemas import ProfileBundle, ProfileDocument, SteeringSpec
from millm.formats.mistudio_schemas import CircuitDefinition, ClusterBundle, ClusterDefinition


# ---- the same, as JSON Schema --------------------------------------------------------------------
def inline(schema: dict) -> dict:
    """A model's JSON Schema with its $defs written in place (for a schema nested inside
    another)."""
    defs = schema.pop("$defs", {})

    def resolve(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        return [resolve(item) for item in node] if isinstance(node, list) else node

    return resolve(schema)


# Component name -> schema, for the served OpenAPI schema (nested models are components too).
SCHEMAS: dict[str, dict] = models_json_schema(
    [
        (model, "validation")
        for model in (
            ProfileDocument,
            ProfileBundle,
            SteeringSpec,
            ClusterDefinition,
            ClusterBundle,
            CircuitDefinition,
        )
    ],
    ref_template="#/components/schemas/{model}",
)[1]["$defs"]
