"""Constrained decoding on the tiny models: every supported keyword yields documents that
validate."""

import json
import re

import pytest
from jsonschema import Draft202012Validator

from millm.engine.constraints import GrammarSpec
from millm.engine.sampling import SamplingParams
from millm.v1.policy.schema_subset import check_schema
from tests.integration.engine_helpers import generate, prompt_ids, row
from tests.unit.test_schema_subset import SUPPORTED_EXAMPLES

SAMPLED = SamplingParams(temperature=1.0)
KEYWORD_SCHEMAS = {
    "type-object": {"type": "object"},
    "type-array": {"type": "array", "maxItems": 3},
    "type-string": {"type": "string", "maxLength": 12},
    "type-number": {"type": "number"},
    "type-integer": {"type": "integer"},
    "type-boolean": {"type": "boolean"},
    "type-null": {"type": "null"},
    **{f"supported-{i}": schema for i, schema in enumerate(SUPPORTED_EXAMPLES)},
    "nested-judge": {
        "type": "object",
        "properties": {
            "label": {"enum": ["humor", "not_humor"]},
            "score": {"type": "integer", "minimum": 0, "maximum": 10},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        },
        "required": ["label", "score"],
        "additionalProperties": False,
    },
}


MODELS = ["llama_lm", "gemma2_lm"]
ROWS, MAX_TOKENS = 4, 120


@pytest.fixture(scope="module")
def constrained_outcomes(request):
    """Generate (model, schema name) on first use and keep it, so each test below asks for what it
    needs itself (no test relies on another having run) and nothing is generated twice."""
    made = {}

    def outcome(model: str, name: str):
        if (model, name) not in made:
            lm = request.getfixturevalue(model)
            spec = GrammarSpec(json.dumps(KEYWORD_SCHEMAS[name]))
            prompt = prompt_ids(lm, "Answer in JSON:")
            rows = [row(prompt, MAX_TOKENS, SAMPLED, seed=seed) for seed in range(ROWS)]
            made[model, name] = generate(
                lm, [type(r)(**{**r.__dict__, "constraint": spec}) for r in rows]
            )
        return made[model, name]

    return outcome


@pytest.mark.parametrize("name", list(KEYWORD_SCHEMAS))
@pytest.mark.parametrize("model", MODELS)
def test_every_keyword_gives_valid_documents(name, model, constrained_outcomes):
    schema = KEYWORD_SCHEMAS[name]
    check_schema(schema)
    out = constrained_outcomes(model, name)
    validator = Draft202012Validator(schema)
    for i in range(ROWS):
        text = out.texts.get(i, "")
        assert not re.search(r"[ \t\r\n]{17,}", text.strip()), f"unbounded whitespace: {text!r}"
        if out.finish[i] == "stop":
            document = json.loads(text)
            assert not list(validator.iter_errors(document)), (text, schema)
        else:
            # A random model may wander inside an unbounded string; it is then cut, never closed
            # invalid.
            assert out.finish[i] == "length" and out.tokens[i] == MAX_TOKENS


def test_most_schemas_close_their_documents(constrained_outcomes):
    """Random tiny models still close most documents within 120 tokens (a schema counts when any
    row on either model closed one)."""
    closed = {
        name
        for name in KEYWORD_SCHEMAS
        for model in MODELS
        if "stop" in constrained_outcomes(model, name).finish.values()
    }
    assert len(closed) >= len(KEYWORD_SCHEMAS) * 0.6, sorted(set(KEYWORD_SCHEMAS) - closed)


def test_grammar_refusals_from_the_library_are_400(llama_lm):
    from millm.errors import InvalidRequest

    with pytest.raises(InvalidRequest) as info:
        llama_lm.grammar.matcher(GrammarSpec(json.dumps({"type": "string", "pattern": "("})))
    assert info.value.code == "response_format_unsupported"
