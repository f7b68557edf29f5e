"""Bodies whose schema says `oneOf` two required fields (text or messages, texts or
conversations, profile or features): exactly one sent, with a value; a second one sent as null is
refused as the schema refuses it."""

import pytest
from pydantic import ValidationError

from millm.lab.discovery.lens_protocol import LensRequest
from millm.lab.discovery.protocol import SteerWith, TextSet

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    "model, body",
    [
        (LensRequest, {"text": "Hi"}),
        (LensRequest, {"messages": MESSAGES}),
        (TextSet, {"texts": ["a"]}),
        (SteerWith, {"profile": "pirate"}),
    ],
)
def test_one_field_with_a_value_is_taken(model, body):
    model.model_validate(body)


@pytest.mark.parametrize(
    "model, body, needle",
    [
        (LensRequest, {}, "give either text or messages"),
        (LensRequest, {"text": "Hi", "messages": MESSAGES}, "give either text or messages"),
        (LensRequest, {"text": None, "messages": MESSAGES}, "give either text or messages"),
        (LensRequest, {"text": None}, "give either text or messages"),
        (TextSet, {"texts": ["a"], "conversations": None}, "give either texts or conversations"),
        (SteerWith, {"profile": None, "features": [{"index": 1, "strength": 2.0}]}, "give either"),
    ],
)
def test_both_none_or_a_null_second_field_are_refused(model, body, needle):
    with pytest.raises(ValidationError, match=needle):
        model.model_validate(body)
