"""The served OpenAPI schema: FastAPI's, brought up to the rules the server really applies.

FastAPI derives each body's schema from its pydantic model (millm's own fields included: the
steering spec, the SAE read, probes, tools), which says types and bounds but not the rules
checked across fields (the field-policy matrix, scoring mode, response_format combinations, a
forced tool choice), the limits that are server settings, or the documents routes read raw.
Each of those modules states its rule as JSON Schema next to its check; this module puts the
statements where generated clients and fuzzers read them. Errors are documented as
they are: OpenAI's error object under `default` (FastAPI's 422 never happens).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from millm.formats.document_json_schemas import SCHEMAS as DOCUMENT_SCHEMAS
from millm.formats.labels import document_schemas as label_document_schemas
from millm.formats.probe_documents import PROBE_DETECTORS, PROBE_SCHEMAS
from millm.interp.intensity import DIAL_SCHEMA
from millm.lab.compare.protocol import VARIANT_RULES, VARIANTS_SCHEMA
from millm.settings import Settings
from millm.v1.policy import field_policy
from millm.v1.policy.field_policy import CHAT, COMPLETIONS, EMBEDDINGS
from millm.v1.policy.request_rules import echo_schema_rules, scoring_schema_rules
from millm.v1.policy.response_format import NAME as SCHEMA_NAME
from millm.v1.policy.response_format import response_format_schema_rules
from millm.v1.policy.schema_rules import absent_or_null, at_most, equals, nullable, sent, when
from millm.v1.policy.schema_subset import SUBSET_SCHEMA
from millm.v1.serving.protocol import (
    BUDGET_RULES,
    CHAT_LOGPROBS,
    COMPLETION_LOGPROBS,
    MESSAGE_RULES,
    PROMPT_SCHEMA,
    STOP_SCHEMA,
    TEXT_PART_SCHEMA,
    TOKEN_IDS_SCHEMA,
    TOP_LOGPROBS_RULES,
)
from millm.v1.serving.tools import TOOL_SCHEMA_RULES

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}
ERROR_RESPONSE = {
    "description": "An error, in OpenAI's shape: the status and `code` say which (see "
    "docs/openai-api.md)",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


# Routes that read their body raw (to store a document byte for byte) declare it here.
RAW_BODIES = {
    "/api/profiles/import": ["ProfileDocument", "ProfileBundle"],
    "/api/clusters/import": ["ClusterDefinition", "ClusterBundle"],
    "/api/circuits/import": ["CircuitDefinition"],
    "/api/probes/import": ["ProbeDocument", "ProbeBundle"],
    "/api/probes": ["ProbeDocument"],
}
# PUT and PATCH of feature labels read their body raw too: a JSON document of any accepted format,
# or CSV.
LABELS_PATH = "/api/saes/{sae_id}/labels"
LABELS_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [
                    _ref(name)
                    for name in (
                        "NeuronpediaExplanations",
                        "NeuronpediaFeatures",
                        "MistudioLabels",
                        "PlainLabels",
                    )
                ]
            }
        },
        "text/csv": {
            "schema": {
                "type": "string",
                "description": "index,label rows; an optional header row whose first cell is index",
            }
        },
    },
}


def _narrow(
    component: dict,
    properties: dict | None = None,
    rules: list[dict] | None = None,
    required: list[str] | None = None,
) -> None:
    """Replace some properties' schemas and add cross-field rules to a component."""
    for name, schema in (properties or {}).items():
        title = component["properties"].get(name, {}).get("title")
        component["properties"][name] = {**schema, **({"title": title} if title else {})}
    if rules:
        component["allOf"] = component.get("allOf", []) + rules
    if required:
        component["required"] = sorted(set(component.get("required", [])) | set(required))


def _requests(schemas: dict, settings: Settings) -> None:
    """The bodies' rules in the served schema. Each is one a model's own schema cannot state, and
    says which: a rule across fields, a limit that is a server setting, or a field a model takes
    wider than it accepts so that its refusal has its own words or error code."""
    _parts(schemas)
    _openai_bodies(schemas, settings)
    _lab_bodies(schemas)


def _parts(schemas: dict) -> None:
    """Message parts and response formats."""
    # Any part parses, so an image part is refused as not honoured rather than as malformed.
    _narrow(
        schemas["TextPart"],
        properties=TEXT_PART_SCHEMA["properties"],
        required=TEXT_PART_SCHEMA["required"],
    )
    # Across fields: content may be absent on an assistant turn only.
    _narrow(schemas["ChatMessage"], rules=MESSAGE_RULES)
    # Any type and name parse, so an unsupported format is refused as response_format_unsupported.
    _narrow(
        schemas["ResponseFormat"],
        properties={"type": {"enum": ["text", "json_object", "json_schema"]}},
        rules=[when({"properties": {"type": {"const": "json_schema"}}}, sent("json_schema"))],
    )
    # The subset is a schema of schemas, served once as its own component.
    _narrow(schemas["ToolFunction"], properties={"parameters": nullable(_ref("SchemaSubset"))})
    # A missing name or schema is refused as response_format_unsupported (structured_of).
    _narrow(
        schemas["JsonSchemaFormat"],
        properties={
            "name": {"type": "string", "pattern": SCHEMA_NAME.pattern},
            "schema": _ref("SchemaSubset"),
        },
        required=["name", "schema"],
    )


def _openai_bodies(schemas: dict, settings: Settings) -> None:
    """Chat and text completions and embeddings."""
    # Across fields: a read has one row's positions.
    single_read = [
        when(
            sent("return_sae_activations"),
            {"allOf": [at_most("n", 1), absent_or_null("extra_messages")]},
        )
    ]
    # A server setting: the models are built before any settings are read.
    _narrow(
        schemas["ReadRequest"],
        properties={
            "top_k": {
                "type": "integer",
                "minimum": 1,
                "maximum": settings.sae_activations_max_top_k,
            }
        },
    )
    # `stop`, the dial and token ids are checked by validators that name the rule they break (four
    # stops at most, none empty; 0-2 or off/min/max; an id the vocabulary lacks).
    _narrow(
        schemas["ChatCompletionRequest"],
        properties={
            "stop": STOP_SCHEMA,
            "steering_intensity": nullable(DIAL_SCHEMA),
            "allowed_token_ids": nullable(TOKEN_IDS_SCHEMA),
        },
        rules=[
            *BUDGET_RULES,
            *TOP_LOGPROBS_RULES,
            *field_policy.schema_rules(CHAT),
            *scoring_schema_rules(CHAT_LOGPROBS, field_policy.scoring_refusals(CHAT), exact=False),
            *response_format_schema_rules(),
            *TOOL_SCHEMA_RULES,
            *single_read,
        ],
    )
    # As on chat; `logprobs` is a count whose `true` is refused in words, `prompt` never empty.
    _narrow(
        schemas["CompletionRequest"],
        properties={
            "stop": STOP_SCHEMA,
            "logprobs": nullable(
                {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 20}, {"const": False}]}
            ),
            "allowed_token_ids": nullable(TOKEN_IDS_SCHEMA),
            "prompt": PROMPT_SCHEMA,
        },
        rules=[
            *BUDGET_RULES,
            *field_policy.schema_rules(COMPLETIONS),
            *scoring_schema_rules(
                COMPLETION_LOGPROBS,
                field_policy.scoring_refusals(COMPLETIONS),
                also=(equals("max_tokens", 0),),
            ),
            *echo_schema_rules(),
            # One prompt: several have several position axes.
            when(
                sent("return_sae_activations"),
                {
                    "properties": {
                        "prompt": {
                            "anyOf": [
                                {"type": "string"},
                                {"type": "array", "items": {"type": "integer"}},
                                {"type": "array", "maxItems": 1},
                            ]
                        }
                    }
                },
            ),
        ],
    )
    # `input` is never empty (a validator); the field policy's matrix is across fields.
    _narrow(
        schemas["EmbeddingRequest"],
        properties={"input": PROMPT_SCHEMA},
        rules=field_policy.schema_rules(EMBEDDINGS),
    )


def _lab_bodies(schemas: dict) -> None:
    """Compare's variants and a probe's update."""
    # A variant may be a bare word (BeforeValidator) and names one kind of steering (across fields).
    _narrow(
        schemas["CompareRequest"],
        properties={"stop": STOP_SCHEMA, "variants": nullable(VARIANTS_SCHEMA)},
        rules=BUDGET_RULES,
    )
    # The detector is validated with the whole stored document, in the probe format's words.
    _narrow(
        schemas["ProbeUpdate"],
        properties={"detector": nullable({"anyOf": [_ref(name) for name in PROBE_DETECTORS]})},
    )
    # The dial, as on chat; each variant names one kind of steering (across fields).
    _narrow(
        schemas["Variant"], properties={"intensity": nullable(DIAL_SCHEMA)}, rules=VARIANT_RULES
    )


def openapi_schema(app: FastAPI, settings: Settings) -> dict:
    """The app's OpenAPI schema with the rules above (built once, then cached on the app)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Error"] = ERROR_SCHEMA
    schemas["SchemaSubset"] = SUBSET_SCHEMA
    schemas.update(DOCUMENT_SCHEMAS)
    schemas.update(label_document_schemas())
    schemas.update(PROBE_SCHEMAS)
    _requests(schemas, settings)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses["default"] = ERROR_RESPONSE
            if path in RAW_BODIES and method == "post":
                body = {"anyOf": [_ref(name) for name in RAW_BODIES[path]]}
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                }
            if path == LABELS_PATH and method in ("put", "patch"):
                operation["requestBody"] = LABELS_BODY
    app.openapi_schema = schema
    return schema


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Serve `openapi_schema` at /openapi.json (and in /docs)."""
    app.openapi = lambda: openapi_schema(app, settings)  # type: ignore[method-assign]  # replacing app.openapi is FastAPI's documented way to customise the schema
