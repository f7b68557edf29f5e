"""The field_not_honoured matrix drives both the check and these tests, cell by cell."""

import pytest

from millm.errors import FieldNotHonoured
from millm.v1.policy.field_policy import (
    ABOVE_ONE,
    ENDPOINTS,
    HONOURED,
    MATRIX,
    NEUTRAL,
    NOT_ON_SCORING,
    NOT_STREAMING,
    REFUSED,
    check_fields,
    is_neutral,
)

# A value for each field that would change the output.
EXAMPLES = {
    "logprobs": 5,
    "allowed_token_ids": [1, 2],
    "top_logprobs": 2,
    "response_format": {"type": "json_object"},
    "seed": 7,
    "n": 2,
    "max_completion_tokens": 5,
    "profile": "p",
    "steering_intensity": 1.0,
    "return_sae_activations": {"positions": "last"},
    "probes": ["pirate"],
    "steering": {"x": 1},
    "dimensions": 8,
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "logit_bias": {"5": 10},
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "echo": True,
    "best_of": 2,
    "suffix": "end",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
}


def cells():
    for field, rules in MATRIX.items():
        for endpoint in ENDPOINTS:
            yield pytest.param(field, endpoint, rules[endpoint], id=f"{field}-{endpoint}")


def refused(field, endpoint, *, scoring=False, streaming=False):
    try:
        check_fields(
            {"model": "m", field: EXAMPLES[field]}, endpoint, scoring=scoring, streaming=streaming
        )
    except FieldNotHonoured as error:
        assert error.param == field and error.status == 400 and error.code == "field_not_honoured"
        assert field in error.message
        return True
    return False


def test_every_row_has_an_example():
    assert set(EXAMPLES) == set(MATRIX)


@pytest.mark.parametrize("field, endpoint, rule", list(cells()))
def test_each_cell(field, endpoint, rule):
    if rule.verdict == HONOURED:
        assert not refused(field, endpoint) and not refused(
            field, endpoint, scoring=True, streaming=True
        )
    elif rule.verdict == REFUSED:
        assert refused(field, endpoint) and refused(field, endpoint, scoring=True)
    elif rule.verdict == ABOVE_ONE:
        assert refused(field, endpoint)
        check_fields({field: 1}, endpoint, scoring=False, streaming=False)
    elif rule.verdict == NOT_STREAMING:
        assert refused(field, endpoint, streaming=True) and not refused(
            field, endpoint, streaming=False
        )
    elif rule.verdict == NOT_ON_SCORING:
        assert refused(field, endpoint, scoring=True) and not refused(
            field, endpoint, scoring=False
        )
    else:
        pytest.fail(f"unknown verdict {rule.verdict}")


@pytest.mark.parametrize("field", list(MATRIX))
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_null_and_neutral_values_pass_everywhere(field, endpoint):
    check_fields({field: None}, endpoint, scoring=True, streaming=True)
    if field in NEUTRAL:
        check_fields({field: NEUTRAL[field]}, endpoint, scoring=True, streaming=True)


def test_the_spec_table_rows():
    """The API page's table, written out once more by hand, must equal the matrix."""
    spec = {
        "logprobs": ("honoured", "honoured", "refused"),
        "allowed_token_ids": ("honoured", "honoured", "refused"),
        "top_logprobs": ("honoured", "refused", "refused"),
        "seed": ("honoured", "honoured", "refused"),
        "n": (NOT_STREAMING, ABOVE_ONE, ABOVE_ONE),
        "max_completion_tokens": ("honoured", "honoured", "refused"),
        # Beyond the page: text completions take a profile and the dial, as the original's do now.
        "profile": (NOT_ON_SCORING, NOT_ON_SCORING, "refused"),
        "steering": (
            NOT_ON_SCORING,
            NOT_ON_SCORING,
            "refused",
        ),  # issue 16: a request's own steering
        "dimensions": ("refused", "refused", "refused"),
        # Beyond the page (issue 9): chat honours tools, except on scoring requests.
        "tools": (NOT_ON_SCORING, "refused", "refused"),
        "tool_choice": (NOT_ON_SCORING, "refused", "refused"),
        "parallel_tool_calls": ("honoured", "refused", "refused"),
        "logit_bias": ("refused", "refused", "refused"),
    }
    for field, verdicts in spec.items():
        assert tuple(MATRIX[field][e].verdict for e in ENDPOINTS) == verdicts, field


def test_true_is_not_a_neutral_one():
    assert (
        not is_neutral("n", True)
        and not is_neutral("logprobs", 0)
        and is_neutral("logprobs", False)
    )
