"""Acceptance: the demo model closes schema-constrained documents that validate."""

import json

import pytest
from jsonschema import Draft202012Validator

from tests.api.clients import sdk
from tests.integration.test_constrained import KEYWORD_SCHEMAS

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
FILM = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "genres": {
            "type": "array",
            "items": {"enum": ["drama", "comedy", "romance", "war"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "rating": {"type": "number", "minimum": 0, "maximum": 10},
        "sequel": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/film"}]},
    },
    "required": ["title", "year", "genres", "rating"],
    "additionalProperties": False,
    "$defs": {
        "film": {
            "type": "object",
            "properties": {"title": {"type": "string", "maxLength": 40}},
            "required": ["title"],
            "additionalProperties": False,
        }
    },
}


def constrained(server, schema, content, max_tokens=150):
    response = sdk(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "doc", "strict": True, "schema": schema},
        },
    )
    return response.choices[0]


def test_a_film_record(demo_server):
    choice = constrained(demo_server, FILM, "Describe the film Casablanca as JSON.")
    assert choice.finish_reason == "stop"
    document = json.loads(choice.message.content)
    assert not list(Draft202012Validator(FILM).iter_errors(document))
    assert "Casablanca" in document["title"]


@pytest.mark.parametrize(
    "name",
    ["type-boolean", "type-integer", "supported-3", "supported-5", "supported-7", "nested-judge"],
)
def test_keyword_schemas(demo_server, name):
    schema = KEYWORD_SCHEMAS[name]
    choice = constrained(demo_server, schema, "Answer with a small JSON value.", max_tokens=80)
    if choice.finish_reason == "stop":
        assert not list(
            Draft202012Validator(schema).iter_errors(json.loads(choice.message.content))
        )
    else:
        assert choice.finish_reason == "length"
