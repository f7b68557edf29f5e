"""return_sae_activations' syntax (parsed with the body; top_k's limit after): defaults, what it
keeps, and refusals naming the field."""

import pytest

from millm.errors import InvalidRequest
from millm.v1.serving.activations import within_top_k
from millm.v1.serving.protocol import ChatCompletionRequest


def parse_read(asked, limit):
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "return_sae_activations": asked,
        }
    )
    return within_top_k(body.return_sae_activations, limit)


def test_defaults_duplicates_and_spans():
    read = parse_read({}, 64)
    assert (read.sae_id, read.features, read.top_k, read.span, read.read_point) == (
        None,
        None,
        8,
        "completion",
        "post_steering",
    )
    read = parse_read(
        {"features": [3, 3, 1], "positions": {"start": 1, "end": 4}, "read_point": "pre_steering"},
        64,
    )
    assert read.features == [3, 1] and read.span == (1, 4) and read.read_point == "pre_steering"


@pytest.mark.parametrize(
    "asked, param, needle",
    [
        ("x", "return_sae_activations", "must be an object"),
        ({"colour": "blue"}, "return_sae_activations.colour", "unknown key"),
        ({"sae_id": 5}, "return_sae_activations.sae_id", "valid string"),
        ({"features": []}, "return_sae_activations.features", "at least 1 item"),
        ({"features": [2, True]}, "return_sae_activations.features[1]", "valid integer, got true"),
        ({"top_k": 2.0}, "return_sae_activations.top_k", "valid integer, got 2.0"),
        (
            {"top_k": 65},
            "return_sae_activations.top_k",
            "at most SAE_ACTIVATIONS_MAX_TOP_K (64), got 65",
        ),
        (
            {"positions": "middle"},
            "return_sae_activations.positions",
            'one of last, prompt, completion, all or {"start", "end"}, got "middle"',
        ),
        (
            {"positions": {"start": 5, "end": 5}},
            "return_sae_activations.positions",
            "0 <= start < end, got start 5 and end 5",
        ),
        ({"positions": {"start": 5}}, "return_sae_activations.positions.end", "required"),
        (
            {"read_point": "inside"},
            "return_sae_activations.read_point",
            "'post_steering' or 'pre_steering'",
        ),
        (
            {"top_k": 0, "read_point": "inside"},
            "return_sae_activations.top_k",
            "(and 1 more problem)",
        ),
    ],
)
def test_refusals_name_the_field(asked, param, needle):
    with pytest.raises(InvalidRequest) as info:
        parse_read(asked, 64)
    assert info.value.param == param and info.value.code == "invalid_parameter"
    assert info.value.message.startswith(f"{param}: ") and needle in info.value.message
