"""response_format on chat completions: its body, what it asks for, and the combinations refused.

`{"type": "text"}` changes nothing; `json_object` constrains to exactly one JSON object;
`json_schema` to a document of the schema (also with `strict: false`). Every rule here reads the
body alone, so the chat request model checks it while parsing (v1/serving/protocol.py); whether
the server batches continuously is the server's to say, and an answer is validated when it is
complete (v1/serving/answers_read.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field

from millm.engine.constraints import GrammarSpec
from millm.v1.policy.body_fields import OpenBody
from millm.v1.policy.schema_rules import absent_or_null, any_of, equals, one_of_values, when
from millm.v1.policy.schema_subset import ResponseFormatUnsupported, check_schema

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
JSON_OBJECT = {"type": "object"}


class JsonSchemaFormat(OpenBody):
    """response_format.json_schema: {name, strict, schema, description}."""

    name: str | None = None
    strict: bool | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    description: str | None = None


class ResponseFormat(OpenBody):
    """response_format: text, json_object or json_schema."""

    type: str
    json_schema: JsonSchemaFormat | None = None


class ChatBody(Protocol):
    """What refuse_combinations reads of a chat completion body (v1/serving/protocol.py)."""

    @property
    def stream(self) -> bool | None: ...
    @property
    def stop(self) -> str | list[str] | None: ...
    @property
    def scoring(self) -> bool: ...
    @property
    def tools(self) -> list[Any] | None: ...
    @property
    def tool_choice(self) -> str | dict[str, Any] | None: ...


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


def structured_of(fmt: ResponseFormat | None) -> Structured | None:
    """The constraint asked for (None for text), refusing unknown types, bad names and schemas
    outside the subset."""
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


def refuse_combinations(body: ChatBody) -> None:
    """Combinations that could cut or skip a document are refused before anything runs."""
    if body.stream:
        raise ResponseFormatUnsupported(
            "response_format cannot be streamed: the document is validated when complete"
        )
    if body.stop:
        raise ResponseFormatUnsupported(
            "response_format cannot be combined with stop: a stop string could cut a document and "
            "report it complete"
        )
    if body.scoring:
        raise ResponseFormatUnsupported(
            "response_format cannot be combined with scoring (logprobs / allowed_token_ids)"
        )
    if body.tools and body.tool_choice != "none":
        raise ResponseFormatUnsupported(
            "response_format cannot be combined with tools: both would shape the same answer"
        )


def refused_under_batching() -> ResponseFormatUnsupported:
    """The refusal of a constrained request while continuous batching is enabled (the server's
    setting)."""
    return ResponseFormatUnsupported(
        "response_format is not served while continuous batching is enabled "
        "(ENABLE_CONTINUOUS_BATCHING): a grammar mask per row would stall every row of the batch"
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


def response_format_schema_rules() -> list[dict]:
    """refuse_combinations as JSON Schema for the served OpenAPI schema; continuous batching is
    the server's setting, so it cannot be stated there. Scoring is said as "no logprobs and no
    allowed_token_ids", a little stricter than the server (logprobs while generating a document
    are served): schema tools cannot generate from the exact `not` beside the other rules."""
    return [
        when(
            CONSTRAINED,
            {
                "allOf": [
                    {"properties": {"stream": {"enum": [None, False]}}},
                    absent_or_null("stop"),
                    {"properties": {"logprobs": {"enum": [None, False]}}},
                    absent_or_null("allowed_token_ids"),
                    TOOLS_NOT_OFFERED,
                ]
            },
        )
    ]
