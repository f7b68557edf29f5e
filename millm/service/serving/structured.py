"""response_format on chat completions: parse it, refuse what cannot be honoured, validate the output.

`{"type": "text"}` changes nothing; `json_object` constrains to exactly one JSON object;
`json_schema` to a document of the schema (also with `strict: false`). A finished document is
validated with the jsonschema package: finish_reason "stop" then means "complete and valid",
and a complete document that fails validation is a 500 constrained_output_invalid, never a 200.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from millm.engine.constraints import GrammarSpec
from millm.errors import ConstrainedOutputInvalid
from millm.protocol.requests import ChatCompletionRequest
from millm.protocol.schema_rules import (
    absent_or_null,
    any_of,
    equals,
    one_of_values,
    when,
)
from millm.protocol.schema_subset import ResponseFormatUnsupported, check_schema

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
JSON_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class Structured:
    """A request's output constraint."""

    mode: str  # json_object | json_schema
    name: str | None
    schema: dict

    @property
    def spec(self) -> GrammarSpec:
        """What the engine compiles for every row."""
        return GrammarSpec(json.dumps(self.schema))


def parse_response_format(body: ChatCompletionRequest) -> Structured | None:
    """The constraint asked for (None for text), refusing unknown types, bad names and schemas outside the subset."""
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Structured("json_object", None, JSON_OBJECT)
    if fmt.type != "json_schema":
        raise ResponseFormatUnsupported(
            f"response_format: type {fmt.type!r} is not one of text, json_object, json_schema"
        )
    spec = fmt.json_schema
    if spec is None:
        raise ResponseFormatUnsupported(
            "response_format: json_schema needs a json_schema object with name and schema"
        )
    if spec.name is None or not NAME.match(spec.name):
        raise ResponseFormatUnsupported(
            "response_format: json_schema.name is required: 1-64 letters, digits, '_' or '-'"
        )
    if spec.schema_ is None:
        raise ResponseFormatUnsupported("response_format: json_schema.schema is required")
    check_schema(spec.schema_)
    return Structured("json_schema", spec.name, spec.schema_)


def refuse_combinations(body: ChatCompletionRequest, batching: bool) -> None:
    """Combinations that could cut or skip a document are refused before anything runs."""
    if batching:
        raise ResponseFormatUnsupported(
            "response_format is not served while continuous batching is enabled (ENABLE_CONTINUOUS_BATCHING): "
            "a grammar mask per row would stall every row of the batch"
        )
    if body.stream:
        raise ResponseFormatUnsupported(
            "response_format cannot be streamed: the document is validated when complete"
        )
    if body.stop:
        raise ResponseFormatUnsupported(
            "response_format cannot be combined with stop: a stop string could cut a document and report it complete"
        )
    if body.scoring:
        raise ResponseFormatUnsupported(
            "response_format cannot be combined with scoring (logprobs / allowed_token_ids)"
        )


CONSTRAINED = {
    "required": ["response_format"],
    "properties": {
        "response_format": {
            "required": ["type"],
            "properties": {"type": {"enum": ["json_object", "json_schema"]}},
        }
    },
}
TOOLS_NOT_OFFERED = any_of(one_of_values("tools", [None, []]), equals("tool_choice", "none"))


def response_format_schema_rules(scoring: dict) -> list[dict]:
    """refuse_combinations (and the tools rule of the chat route) as JSON Schema for the served
    OpenAPI schema; continuous batching is the server's setting, so it cannot be stated there."""
    return [
        when(
            CONSTRAINED,
            {
                "allOf": [
                    {"properties": {"stream": {"enum": [None, False]}}},
                    absent_or_null("stop"),
                    {"not": scoring},
                    TOOLS_NOT_OFFERED,
                ]
            },
        )
    ]


def validate_output(structured: Structured, text: str, index: int) -> None:
    """A complete document must parse and validate; otherwise 500 constrained_output_invalid."""
    from jsonschema import Draft202012Validator

    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstrainedOutputInvalid(
            f"choice {index}: the completed output is not valid JSON ({exc})"
        ) from None
    if structured.mode == "json_object":
        if not isinstance(document, dict):
            raise ConstrainedOutputInvalid(
                f"choice {index}: the completed output is not a JSON object"
            )
        return
    error = next(iter(Draft202012Validator(structured.schema).iter_errors(document)), None)
    if error is not None:
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        raise ConstrainedOutputInvalid(
            f"choice {index}: the completed output fails the schema at {where}: {error.message}"
        )
