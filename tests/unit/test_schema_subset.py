"""The JSON Schema subset: supported keywords pass, every other keyword is named with its
pointer."""

import pytest

from millm.errors import ConstrainedOutputInvalid
from millm.v1.policy.response_format import Structured
from millm.v1.policy.schema_subset import MAX_DEPTH, ResponseFormatUnsupported, check_schema
from millm.v1.serving.answers_read import validate_output

SUPPORTED_EXAMPLES = [
    {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    {"type": ["string", "null"], "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
    {"type": "integer", "minimum": 0, "maximum": 10},
    {"enum": ["a", 1, None]},
    {"const": "fixed"},
    {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
    {"$defs": {"item": {"type": "string"}}, "type": "array", "items": {"$ref": "#/$defs/item"}},
    {"type": "object", "title": "T", "description": "d", "default": {}, "examples": [{}]},
]


@pytest.mark.parametrize("schema", SUPPORTED_EXAMPLES)
def test_supported(schema):
    check_schema(schema)


@pytest.mark.parametrize(
    "schema, named",
    [
        ({"type": "integer", "multipleOf": 3}, ["multipleOf at /multipleOf"]),
        ({"not": {"type": "string"}}, ["not at /not"]),
        ({"type": "array", "uniqueItems": True}, ["uniqueItems at /uniqueItems"]),
        ({"allOf": [{"type": "string"}]}, ["allOf at /allOf"]),
        ({"oneOf": [{"type": "string"}]}, ["oneOf at /oneOf"]),
        ({"if": {}, "then": {}, "else": {}}, ["if at /if", "then at /then", "else at /else"]),
        ({"type": "string", "format": "email"}, ["format at /format"]),
        (
            {"type": "object", "patternProperties": {"^x": {}}},
            ["patternProperties at /patternProperties"],
        ),
        (
            {"type": "object", "dependentRequired": {"a": ["b"]}},
            ["dependentRequired at /dependentRequired"],
        ),
        (
            {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
            ["$schema at /$schema"],
        ),
        (
            {"$ref": "https://example.com/schema.json"},
            ["$ref (not a local #/$defs/ reference) at /$ref"],
        ),
        ({"type": "array", "items": [{"type": "string"}]}, ["items (array form) at /items"]),
        (
            {
                "type": "object",
                "properties": {"a/b": {"type": "number", "multipleOf": 2}, "c~d": {"not": {}}},
            },
            ["multipleOf at /properties/a~1b/multipleOf", "not at /properties/c~0d/not"],
        ),
        (
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"uniqueItems": True}}]},
            ["uniqueItems at /anyOf/1/items/uniqueItems"],
        ),
    ],
)
def test_refused_keywords_are_named_with_pointers(schema, named):
    with pytest.raises(ResponseFormatUnsupported) as info:
        check_schema(schema)
    assert (
        info.value.status == 400
        and info.value.code == "response_format_unsupported"
        and info.value.param == "response_format"
    )
    for entry in named:
        assert entry in info.value.message


def test_limits():
    check_schema(
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(256)}}
    )
    with pytest.raises(ResponseFormatUnsupported, match="257 properties; at most 256"):
        check_schema(
            {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(257)}}
        )
    deep = {"type": "string"}
    for _ in range(MAX_DEPTH - 1):
        deep = {"type": "array", "items": deep}
    check_schema(deep)
    with pytest.raises(ResponseFormatUnsupported, match="nesting deeper than 32"):
        check_schema({"type": "array", "items": deep})
    with pytest.raises(ResponseFormatUnsupported, match="at most 65536"):
        check_schema({"type": "string", "description": "x" * 70_000})


def test_broken_schemas():
    for schema, message in [
        ({"type": "text"}, "unknown type"),
        ({"type": [{}]}, "unknown type"),
        ({"$ref": "#/$defs/missing"}, "names no entry"),
        ({"required": "a"}, "list of property names"),
        ([1], "must be an object"),
    ]:
        with pytest.raises(ResponseFormatUnsupported, match=message):
            check_schema(schema)


JUDGE = Structured(
    "json_schema",
    "judge_v1",
    {
        "type": "object",
        "properties": {"label": {"enum": ["humor", "not_humor"]}},
        "required": ["label"],
        "additionalProperties": False,
    },
)


def test_validation_step_passes_valid_documents():
    validate_output(JUDGE, '{"label": "humor"}', 0)
    validate_output(Structured("json_object", None, {"type": "object"}), '{"any": [1, 2]}', 0)


@pytest.mark.parametrize(
    "structured, text, message",
    [
        (JUDGE, '{"label": "funny"}', "fails the schema at /label"),
        (JUDGE, '{"label": "humor", "extra": 1}', "fails the schema at /"),
        (JUDGE, '{"label": "hum', "not valid JSON"),
        (Structured("json_object", None, {"type": "object"}), "[1, 2]", "not a JSON object"),
    ],
)
def test_a_disagreeing_document_is_a_500_never_a_200(structured, text, message):
    with pytest.raises(ConstrainedOutputInvalid) as info:
        validate_output(structured, text, 2)
    assert info.value.status == 500 and info.value.code == "constrained_output_invalid"
    assert message in info.value.message and "choice 2" in info.value.message
