"""Properties of the JSON Schema subset check (millm/v1/policy/schema_subset.py), over random
schemas.

Schemas built only from the supported keywords (and the ignored annotations) are accepted and
are valid against the subset as the served OpenAPI schema states it (SchemaSubset); a refused
keyword put anywhere a schema stands is refused, named with its JSON pointer, however deep.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from millm.errors import ResponseFormatUnsupported
from millm.v1.policy.schema_subset import (
    ANNOTATIONS,
    MAX_DEPTH,
    SUBSET_SCHEMA,
    SUPPORTED,
    TYPES,
    check_schema,
)

# Property and $defs names include keyword look-alikes and the characters pointers escape.
NAMES = st.one_of(
    st.sampled_from(["not", "type", "format", "a/b", "c~d", "~1"]),
    st.text("ab/~ é", min_size=1, max_size=4),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=3,
)
COUNTS = st.integers(0, 50)
BOUNDS = st.one_of(st.integers(-100, 100), st.floats(-1e6, 1e6, allow_nan=False))
KEYWORDS = {
    "type": st.one_of(
        st.sampled_from(sorted(TYPES)),
        st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3, unique=True),
    ),
    "minItems": COUNTS,
    "maxItems": COUNTS,
    "minLength": COUNTS,
    "maxLength": COUNTS,
    "minimum": BOUNDS,
    "maximum": BOUNDS,
    "enum": st.lists(JSON, min_size=1, max_size=3),
    "const": JSON,
    "pattern": st.sampled_from(["^[a-z]+$", "a|b", "[0-9]{2}", ""]),
    "required": st.lists(NAMES, max_size=3),
    "title": st.text(max_size=5),
    "description": st.text(max_size=5),
    "default": JSON,
    "examples": st.lists(JSON, max_size=2),
}
assert set(KEYWORDS) == (SUPPORTED | ANNOTATIONS) - {
    "properties",
    "additionalProperties",
    "items",
    "anyOf",
    "$ref",
    "$defs",
}
# Every keyword of JSON Schema 2020-12 outside the subset (and one made up): each must be refused.
REFUSED = [
    "multipleOf",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "not",
    "allOf",
    "oneOf",
    "if",
    "then",
    "else",
    "format",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "prefixItems",
    "unevaluatedItems",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "$schema",
    "$id",
    "$anchor",
    "$dynamicRef",
    "$comment",
    "contentEncoding",
    "contentMediaType",
    "readOnly",
    "deprecated",
    "x-made-up",
]


def escape(name: str) -> str:
    """RFC 6901: one reference token."""
    return name.replace("~", "~0").replace("/", "~1")


def schemas(refs: list[str]):
    """Schemas of the supported keywords; `refs` are $defs names a local $ref may point at."""
    leaf = st.fixed_dictionaries({}, optional=KEYWORDS)
    if refs:
        leaf = leaf | st.sampled_from(refs).map(lambda name: {"$ref": "#/$defs/" + escape(name)})

    def extend(inner):
        # true/false are schemas too, wherever a subschema stands
        sub = inner | st.booleans()
        nested = {
            "properties": st.dictionaries(NAMES, sub, max_size=3),
            "additionalProperties": sub,
            "items": sub,
            "anyOf": st.lists(sub, min_size=1, max_size=3),
        }
        return st.fixed_dictionaries({}, optional={**KEYWORDS, **nested})

    return st.recursive(leaf, extend, max_leaves=5)


@st.composite
def documents(draw):
    """A whole schema: an object, with $defs that its local references point into."""
    names = draw(st.lists(NAMES, max_size=2, unique=True))
    root = dict(draw(schemas(names)))
    if names:  # flat entries keep the draw cheap; nesting is exercised in the root
        entries = st.fixed_dictionaries({}, optional=KEYWORDS) | st.booleans()
        root["$defs"] = {name: draw(entries) for name in names}
    return root


def places(schema, path=()):
    """Every (path, object) where a schema object stands, the root first."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key in ("properties", "$defs"):
        for name, sub in schema.get(key, {}).items():
            yield from places(sub, (*path, key, name))
    for key in ("additionalProperties", "items"):
        if key in schema:
            yield from places(schema[key], (*path, key))
    for i, sub in enumerate(schema.get("anyOf", [])):
        yield from places(sub, (*path, "anyOf", str(i)))


SERVED = Draft202012Validator(
    {
        "$ref": "#/components/schemas/SchemaSubset",
        "components": {"schemas": {"SchemaSubset": SUBSET_SCHEMA}},
    }
)


@given(documents())
def test_schemas_of_supported_keywords_are_accepted_and_match_the_served_subset(schema):
    # within the limits by construction
    assert max(len(path) for path, _ in places(schema)) < MAX_DEPTH
    check_schema(schema)
    assert not [error.message for error in SERVED.iter_errors(schema)]


@given(documents(), st.data())
def test_a_refused_keyword_anywhere_is_refused_naming_its_pointer(schema, data):
    found = list(places(schema))
    chosen = data.draw(
        st.lists(st.sampled_from(range(len(found))), min_size=1, max_size=3, unique=True)
    )
    named = []
    for index in chosen:
        path, node = found[index]
        keyword = data.draw(st.sampled_from(REFUSED))
        node[keyword] = data.draw(JSON)
        named.append(f"{keyword} at " + "".join("/" + escape(part) for part in (*path, keyword)))
    try:
        check_schema(schema)
    except ResponseFormatUnsupported as refusal:
        assert refusal.status == 400 and refusal.param == "response_format"
        listed = refusal.message.removeprefix("response_format: unsupported JSON Schema keywords: ")
        assert sorted(listed.split(", ")) == sorted(named)
    else:
        raise AssertionError(f"accepted although it holds {named}")
