"""Tool calling without a model: parsing tools and choices, reading calls from text, streaming
holdback, message conversion."""

import json

import pytest

from millm.errors import InvalidRequest
from millm.v1.policy.schema_subset import ResponseFormatUnsupported
from millm.v1.serving.answers_read import CallHoldback, read_answer
from millm.v1.serving.protocol import ChatCompletionRequest
from millm.v1.serving.tools import tool_messages

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def plan(**fields):
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )
    return body.tool_plan


def test_choices_map_to_modes():
    assert plan() is None
    assert plan(tools=[WEATHER]).mode == "auto"
    assert plan(tools=[WEATHER], tool_choice="none").offered is False
    assert plan(tools=[WEATHER], tool_choice="required").constrained
    forced = plan(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    assert (forced.mode, forced.forced) == ("forced", "get_time")
    # no parameters: any object
    assert json.loads(forced.grammar().schema_json) == {"type": "object"}
    required = json.loads(plan(tools=[WEATHER, TIME], tool_choice="required").grammar().schema_json)
    assert [branch["properties"]["name"]["const"] for branch in required["anyOf"]] == [
        "get_weather",
        "get_time",
    ]


@pytest.mark.parametrize(
    "fields, needle",
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not among the tools",
        ),
        ({"tool_choice": "required"}, "no tools were sent"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0] must be"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "function.name"),
        ({"tools": [WEATHER, WEATHER]}, "share a name"),
    ],
)
def test_malformed_tools_and_choices_are_refused(fields, needle):
    with pytest.raises(InvalidRequest) as info:
        plan(**fields)
    assert needle in info.value.message


def test_parameters_outside_the_subset_are_refused_with_keyword_and_pointer():
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"d": {"type": "string", "format": "date"}},
            },
        },
    }
    with pytest.raises(ResponseFormatUnsupported) as info:
        plan(tools=[WEATHER, tool])
    assert (
        info.value.code == "response_format_unsupported"
        and info.value.param == "tools[1].function.parameters"
    )
    assert "format at /properties/d/format" in info.value.message


def test_auto_reads_valid_calls_and_keeps_the_rest_as_content():
    auto = plan(tools=[WEATHER, TIME])
    text = (
        'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call> Done.'
    )
    read = read_answer(auto, text, "stop", 0)
    assert [json.loads(c["function"]["arguments"]) for c in read.calls] == [{"city": "Paris"}, {}]
    assert [c["function"]["name"] for c in read.calls] == ["get_weather", "get_time"]
    assert read.content == "Let me check.  Done." and read.finish_reason("stop") == "tool_calls"
    single = read_answer(plan(tools=[WEATHER, TIME], parallel_tool_calls=False), text, "stop", 0)
    assert [c["function"]["name"] for c in single.calls] == ["get_weather"]


@pytest.mark.parametrize(
    "text",
    [
        "no call here",
        # fails the schema
        '<tool_call>{"name": "get_weather", "arguments": {"town": "Paris"}}</tool_call>',
        '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',  # unknown tool
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa',  # cut
    ],
)
def test_text_that_is_not_a_valid_call_stays_text(text):
    read = read_answer(plan(tools=[WEATHER]), text, "stop", 0)
    assert read.calls == [] and read.content == text and read.finish_reason("stop") == "stop"


def test_an_unclosed_final_call_is_still_a_call():
    read = read_answer(
        plan(tools=[WEATHER]),
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}',
        "stop",
        0,
    )
    assert [c["function"]["name"] for c in read.calls] == ["get_weather"] and read.content is None


def test_holdback_never_streams_call_markup():
    hold = CallHoldback()
    pieces = ["Sure", ". <tool", "_ca", 'll>{"name"', ": 1}</tool_call>"]
    streamed = "".join(hold.push(p) for p in pieces)
    assert streamed == "Sure. " and hold.flush().startswith("<tool_call>{")
    plain = CallHoldback()
    assert "".join(plain.push(p) for p in ["a <", "b", " <t"]) + plain.flush() == "a <b <t"


def test_messages_for_a_template_without_tools():
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    out = tool_messages(history, plan(tools=[WEATHER]), native=False)
    assert out[0]["role"] == "system" and '"name": "get_weather"' in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    }
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    native = tool_messages(history, plan(tools=[WEATHER]), native=True)
    assert native[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert native[2]["role"] == "tool" and len(native) == 3


def test_forced_grammars_close_objects_that_say_nothing_of_other_keys():
    from millm.v1.serving.tools import closed

    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "string"}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
        },
        "$defs": {"d": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
    out = closed(schema)
    assert out["additionalProperties"] is False
    assert set(out["properties"]) == {
        "properties",
        "open",
    }  # a property named "properties" stays a property
    assert out["properties"]["properties"]["additionalProperties"] is False
    assert out["properties"]["open"]["additionalProperties"] is True
    assert out["$defs"]["d"]["additionalProperties"] is False
