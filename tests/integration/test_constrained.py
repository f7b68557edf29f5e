"""Constrained decoding on the tiny models: every supported keyword yields documents that validate."""

import json
import re

import pytest
from jsonschema import Draft202012Validator

from millm.engine.constraints import GrammarSpec
from millm.engine.sampling import SamplingParams
from millm.protocol.schema_subset import check_schema
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
        "properties": {"label": {"enum": ["humor", "not_humor"]}, "score": {"type": "integer", "minimum": 0, "maximum": 10},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
        "required": ["label", "score"],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize("name", list(KEYWORD_SCHEMAS))
@pytest.mark.parametrize("model", ["llama_lm", "gemma2_lm"])
def test_every_keyword_gives_valid_documents(name, model, request):
    lm = request.getfixturevalue(model)
    schema = KEYWORD_SCHEMAS[name]
    check_schema(schema)
    spec = GrammarSpec(json.dumps(schema))
    prompt = prompt_ids(lm, "Answer in JSON:")
    rows = [row(prompt, 120, SAMPLED, seed=seed) for seed in range(4)]
    rows = [type(r)(**{**r.__dict__, "constraint": spec}) for r in rows]
    out = generate(lm, rows)
    validator = Draft202012Validator(schema)
    for i in range(4):
        text = out.texts.get(i, "")
        assert not re.search(r"[ \t\r\n]{17,}", text.strip()), f"unbounded whitespace: {text!r}"
        if out.finish[i] == "stop":
            CLOSED.append(name)
            document = json.loads(text)
            assert not list(validator.iter_errors(document)), (text, schema)
        else:
            # A random model may wander inside an unbounded string; it is then cut, never closed invalid.
            assert out.finish[i] == "length" and out.tokens[i] == 120


CLOSED: list[str] = []


def test_most_schemas_close_their_documents():
    """Run after the suite above: random tiny models still close most documents within 120 tokens."""
    if not CLOSED:
        pytest.skip("the keyword suite did not run in this session")
    assert len(set(CLOSED)) >= len(KEYWORD_SCHEMAS) * 0.6, sorted(set(KEYWORD_SCHEMAS) - set(CLOSED))


def test_grammar_refusals_from_the_library_are_400(llama_lm):
    from millm.errors import InvalidRequest

    with pytest.raises(InvalidRequest) as info:
        llama_lm.grammar.matcher(GrammarSpec(json.dumps({"type": "string", "pattern": "("})))
    assert info.value.code == "response_format_unsupported"
