"""The table of not-yet-honoured fields drives both the check and these tests."""

import pytest

from millm.api.field_policy import CHAT, COMPLETIONS, EMBEDDINGS, NOT_HONOURED, refuse_unhonoured
from millm.errors import FieldNotHonoured

OUTPUT_CHANGING = {
    "logprobs": 5,
    "top_logprobs": 2,
    "allowed_token_ids": [1, 2],
    "response_format": {"type": "json_object"},
    "profile": "p",
    "steering_intensity": 1.0,
    "steering": {"x": 1},
    "dimensions": 8,
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "logit_bias": {"5": 10},
    "echo": True,
    "best_of": 2,
    "suffix": "end",
    "seed": 7,
    "n": 2,
    "max_completion_tokens": 5,
}
NEUTRAL = {
    "logprobs": False,
    "response_format": {"type": "text"},
    "tools": [],
    "logit_bias": {},
    "echo": False,
    "best_of": 1,
    "n": 1,
}


def cases():
    for field, (endpoints, _, _) in NOT_HONOURED.items():
        for endpoint in (CHAT, COMPLETIONS, EMBEDDINGS):
            yield field, endpoint, endpoint in endpoints


def test_every_table_row_has_an_output_changing_example():
    assert set(OUTPUT_CHANGING) == set(NOT_HONOURED)


@pytest.mark.parametrize("field, endpoint, refused", list(cases()))
def test_output_changing_values_are_refused_naming_the_field(field, endpoint, refused):
    body = {"model": "m", field: OUTPUT_CHANGING[field]}
    if refused:
        with pytest.raises(FieldNotHonoured) as info:
            refuse_unhonoured(body, endpoint)
        assert info.value.param == field
        assert info.value.status == 400 and info.value.code == "field_not_honoured"
    else:
        refuse_unhonoured(body, endpoint)


@pytest.mark.parametrize("field", list(NOT_HONOURED))
@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS, EMBEDDINGS])
def test_null_and_neutral_values_pass(field, endpoint):
    refuse_unhonoured({field: None}, endpoint)
    if field in NEUTRAL:
        refuse_unhonoured({field: NEUTRAL[field]}, endpoint)


def test_one_is_not_true_for_logprobs():
    # logprobs: true is output-changing even though True == 1 in Python.
    with pytest.raises(FieldNotHonoured):
        refuse_unhonoured({"logprobs": True}, CHAT)
