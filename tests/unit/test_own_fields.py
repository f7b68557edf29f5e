"""millm's own request fields (`steering`, `return_sae_activations`, `probes`, `tools`) are typed
and parsed with the body, each refused in its own format's words, and the served schema is the
models' own."""

import pytest

from millm.errors import InvalidProbe, InvalidRequest
from millm.formats.document_schemas import SteeringSpec
from millm.formats.probe_documents import MAX_REQUEST_PROBES, InlineProbe
from millm.v1.policy.field_policy import unused_locations
from millm.v1.responses.protocol import ResponsesRequest
from millm.v1.serving.activations import ReadRequest
from millm.v1.serving.protocol import ChatCompletionRequest
from millm.v1.serving.tools import ChatTool

USER = {"role": "user", "content": "hi"}
STEERING = {"steering": [{"sae_id": "sae_a", "features": [{"index": 3, "strength": 4.0}]}]}
DETECTOR = {"type": "feature", "sae_id": "sae_a", "index": 7, "threshold": 0.5}
TOOL = {"type": "function", "function": {"name": "get_time"}}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [USER], **fields})


def refusal(**fields) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        chat(**fields)
    return info.value


def test_each_field_is_its_model_once_parsed():
    body = chat(
        steering=STEERING,
        return_sae_activations={"top_k": 3},
        probes=["saved-one", {"name": "inline-one", "detector": DETECTOR}],
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert isinstance(body.steering, SteeringSpec)
    assert body.steering.steering[0].features[0].strength == 4.0
    assert isinstance(body.return_sae_activations, ReadRequest)
    assert body.return_sae_activations.top_k == 3
    assert body.probes is not None and body.probes[0] == "saved-one"
    assert isinstance(body.probes[1], InlineProbe) and body.probes[1].name == "inline-one"
    assert body.tools is not None and isinstance(body.tools[0], ChatTool)
    assert body.tool_plan is not None
    assert (body.tool_plan.mode, body.tool_plan.forced) == ("forced", "get_time")


@pytest.mark.parametrize(
    "fields, error, param, needle",
    [
        (
            {"steering": {"steering": [{"sae_id": "a", "features": [{"index": -1}]}]}},
            InvalidRequest,
            "steering.steering[0].features[0].index",
            "greater than or equal to 0",
        ),
        ({"steering": {**STEERING, "colour": 1}}, InvalidRequest, "steering", "steering.colour"),
        ({"steering": STEERING, "profile": "p"}, InvalidRequest, "steering", "send either"),
        (
            {"return_sae_activations": {"colour": 1}},
            InvalidRequest,
            "return_sae_activations.colour",
            "unknown key",
        ),
        ({"probes": "p"}, InvalidRequest, "probes", "must be a list"),
        (
            {"probes": ["p"] * (MAX_REQUEST_PROBES + 1)},
            InvalidRequest,
            "probes",
            f"a request takes at most {MAX_REQUEST_PROBES}",
        ),
        (
            {"probes": ["p", {"detector": {**DETECTOR, "index": "x"}}]},
            InvalidProbe,
            "probes[1].detector.index",
            "invalid probe",
        ),
        ({"tools": [{"type": "retrieval"}]}, InvalidRequest, "tools[0]", "tools[0] must be"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            InvalidRequest,
            "tools[0].function.name",
            "1-64 letters",
        ),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, InvalidRequest, "tool_choice", "must be"),
    ],
)
def test_a_problem_is_refused_in_the_fields_own_words(fields, error, param, needle):
    refused = refusal(**fields)
    assert type(refused) is error and refused.param == param and needle in refused.message


def test_a_tools_unknown_key_is_reported_and_strict_is_known():
    function = {"name": "get_time", "strict": True, "colour": "red"}
    body = chat(tools=[{"type": "function", "function": function, "extra": 1}])
    assert unused_locations(body) == ["tools[0].extra", "tools[0].function.colour"]


def test_a_responses_body_parses_the_same_fields_the_same_way():
    body = ResponsesRequest.model_validate(
        {"model": "m", "input": "hi", "steering": STEERING, "probes": ["p"]}
    )
    assert isinstance(body.steering, SteeringSpec) and body.probes == ["p"]
    with pytest.raises(InvalidRequest) as info:
        ResponsesRequest.model_validate(
            {"model": "m", "input": "hi", "return_sae_activations": {"top_k": 0}}
        )
    assert info.value.param == "return_sae_activations.top_k"


def test_the_schema_is_the_models_own():
    schema = ChatCompletionRequest.model_json_schema(ref_template="{model}")
    fields = schema["properties"]
    assert fields["tools"]["anyOf"][0]["items"] == {"$ref": "ChatTool"}
    assert {"$ref": "ReadRequest"} in fields["return_sae_activations"]["anyOf"]
    assert {"$ref": "RequestSteering"} in fields["steering"]["anyOf"]
    assert {"$ref": "InlineSteering"} in fields["steering"]["anyOf"]
    probes = fields["probes"]["anyOf"][0]
    assert probes["maxItems"] == MAX_REQUEST_PROBES
    assert {"$ref": "InlineProbe"} in probes["items"]["oneOf"]
