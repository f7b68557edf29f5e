"""Tool calling on live servers: a tiny Llama whose chat template takes tools (built here) and the
tiny Llama whose template does not. Forced calls always parse and validate; auto answers text or
valid calls; a full round trip; streamed calls equal whole ones; LangChain's bind_tools and
with_structured_output(method="function_calling"); an Open WebUI-shaped request; refusals."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from jsonschema import Draft202012Validator

from tests.api.clients import MODEL, answer_events, post, sse_events
from tests.support import tiny_models
from tests.support.server import ServerProcess

TOOLS_MODEL = "tiny-tools"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 8}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_server(tiny_dirs, tmp_path_factory):
    base = tmp_path_factory.mktemp("tools-model")
    tiny_models.build_tokenizer(base / "tokenizer", chat_template=tiny_models.TOOLS_TEMPLATE)
    directory = tiny_models.build_llama(base / TOOLS_MODEL, base / "tokenizer", seed=3)
    process = ServerProcess(tmp_path_factory.mktemp("tools-home"), ["--model", str(directory)])
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def prompted_server(tiny_dirs, tmp_path_factory):
    """The tiny Llama (its template takes no tools) with tools offered in a system message even
    though it is small."""
    process = ServerProcess(
        tmp_path_factory.mktemp("prompted-home"),
        ["--model", str(tiny_dirs["llama"])],
        env={"MILLM_PROMPTED_TOOLS": "on"},
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(params=["native", "prompted"])
def target(request, tools_server, prompted_server):
    """(server, model): a template that takes tools, and one that does not (tools offered in a
    system message)."""
    return (tools_server, TOOLS_MODEL) if request.param == "native" else (prompted_server, MODEL)


def chat(target, **fields):
    server, model = target
    response = post(
        server,
        "/v1/chat/completions",
        {"model": model, "messages": ASK, "max_tokens": 200, **fields},
    )
    return response


def assert_valid(call: dict) -> dict:
    assert call["type"] == "function" and call["id"].startswith("call_")
    arguments = json.loads(call["function"]["arguments"])
    assert not list(Draft202012Validator(SCHEMAS[call["function"]["name"]]).iter_errors(arguments))
    return arguments


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
def test_forced_calls_always_parse_and_validate(target, choice):
    response = chat(target, tools=TOOLS, tool_choice=choice, n=3, temperature=1.0, seed=5)
    assert response.status_code == 200, response.text
    for entry in response.json()["choices"]:
        assert entry["finish_reason"] == "tool_calls", entry
        assert entry["message"]["content"] is None
        [call] = entry["message"]["tool_calls"]
        assert_valid(call)
        if isinstance(choice, dict):
            assert call["function"]["name"] == "get_time"


def test_auto_answers_text_or_valid_calls(target):
    for seed in range(3):
        entry = chat(target, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=40).json()[
            "choices"
        ][0]
        if entry["finish_reason"] == "tool_calls":
            for call in entry["message"]["tool_calls"]:
                assert_valid(call)
        else:
            assert (
                isinstance(entry["message"]["content"], str)
                and "tool_calls" not in entry["message"]
            )


def test_none_offers_no_tools_and_answers_text(target):
    server, model = target
    with_none = chat(target, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8).json()
    without = chat(target, temperature=0, max_tokens=8).json()
    assert with_none["choices"][0]["message"] == without["choices"][0]["message"]
    assert with_none["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"]


def test_a_full_round_trip(target):
    first = chat(
        target,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
    ).json()
    message = first["choices"][0]["message"]
    [call] = message["tool_calls"]
    history = ASK + [
        message,
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temperature": 21})},
    ]
    second = chat(target, messages=history, tools=TOOLS, temperature=0, max_tokens=12)
    assert second.status_code == 200, second.text
    # the earlier call was rendered
    assert "tool_calls" not in second.headers.get("x-millm-ignored-fields", "")
    assert second.json()["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]


def test_streamed_calls_reassemble_to_the_whole_answer(target):
    fields = {"tools": TOOLS, "tool_choice": "required", "temperature": 0}
    whole = chat(target, **fields).json()["choices"][0]
    events = answer_events(sse_events(chat(target, stream=True, **fields).text))
    calls: dict[int, dict] = {}
    content = ""
    for event in events[:-1]:
        delta = event["choices"][0]["delta"]
        content += delta.get("content") or ""
        for piece in delta.get("tool_calls") or []:
            slot = calls.setdefault(piece["index"], {"name": "", "arguments": ""})
            slot["name"] += piece.get("function", {}).get("name") or ""
            slot["arguments"] += piece.get("function", {}).get("arguments") or ""
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls" and content == ""
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in whole["message"]["tool_calls"]
    ]


def test_an_open_webui_shaped_request_streams(target):
    """Many tools, no tool_choice, streaming (12 here: the tiny tokenizer spends ~120 tokens per
    tool; the acceptance test sends full-size tools to the demo model)."""
    server, model = target
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"t{i}",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        for i in range(12)
    ]
    body = {
        "model": model,
        "messages": ASK,
        "tools": tools,
        "stream": True,
        "max_tokens": 16,
        "stream_options": {"include_usage": True},
    }
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert "x-millm-ignored-fields" not in response.headers
    events = answer_events(sse_events(response.text))
    assert events[-2]["usage"]["completion_tokens"] >= 1


def test_langchain_bind_tools_and_structured_output(target):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    server, model = target

    class Weather(BaseModel):
        """Get the current weather in a city."""

        city: str = Field(max_length=12, description="the city")
        unit: Literal["celsius", "fahrenheit"]

    llm = ChatOpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="not-needed",
        model=model,
        temperature=0,
        max_tokens=200,
        max_retries=0,
    )
    message = llm.bind_tools([Weather], tool_choice="Weather").invoke("Weather in Paris?")
    assert len(message.tool_calls) == 1, (
        message.content,
        message.invalid_tool_calls,
        message.response_metadata,
    )
    [call] = message.tool_calls
    assert call["name"] == "Weather" and Weather(**call["args"])
    structured = llm.with_structured_output(Weather, method="function_calling").invoke(
        "Weather in Paris?"
    )
    assert isinstance(structured, Weather) and len(structured.city) <= 12


def test_a_small_model_without_a_tools_template_answers_auto_as_text_and_says_so(llama_server):
    """MILLM_PROMPTED_TOOLS=auto (the default): under 1B parameters, auto tools are not offered."""
    base = {"model": MODEL, "messages": ASK, "max_tokens": 8, "temperature": 0}
    plain = post(llama_server, "/v1/chat/completions", base)
    auto = post(
        llama_server, "/v1/chat/completions", {**base, "tools": TOOLS, "tool_choice": "auto"}
    )
    assert (
        auto.status_code == 200
        and auto.headers["x-millm-ignored-fields"] == '"tools", "tool_choice"'
    )
    assert auto.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [auto.json()["usage"][k] for k in counts] == [plain.json()["usage"][k] for k in counts]
    # the same prompt: the second request reuses the first's cached prefix
    assert (
        auto.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= plain.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    strict = post(
        llama_server,
        "/v1/chat/completions",
        {**base, "tools": TOOLS},
        headers={"X-miLLM-Strict": "true"},
    )
    assert strict.status_code == 400 and strict.json()["error"]["code"] == "unused_fields_refused"
    forced = post(
        llama_server,
        "/v1/chat/completions",
        {**base, "max_tokens": 200, "tools": TOOLS, "tool_choice": "required"},
    )
    assert (
        forced.json()["choices"][0]["finish_reason"] == "tool_calls"
        and "x-millm-ignored-fields" not in forced.headers
    )


@pytest.mark.parametrize(
    "path, fields, status, code, needle",
    [
        (
            "/v1/chat/completions",
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "not": {}}},
                    }
                ]
            },
            400,
            "response_format_unsupported",
            "not at /not",
        ),
        (
            "/v1/chat/completions",
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "ghost"}}},
            400,
            "invalid_parameter",
            "ghost",
        ),
        (
            "/v1/chat/completions",
            {"tools": TOOLS, "response_format": {"type": "json_object"}},
            400,
            "response_format_unsupported",
            "tools",
        ),
        (
            "/v1/chat/completions",
            {"tools": TOOLS, "logprobs": True, "max_tokens": 1},
            400,
            "field_not_honoured",
            "scoring",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "tools": TOOLS},
            400,
            "field_not_honoured",
            "chat completions",
        ),
    ],
)
def test_refusals(llama_server, path, fields, status, code, needle):
    body = {"model": MODEL, **({"messages": ASK} if "chat" in path else {}), **fields}
    response = post(llama_server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and needle in error["message"]
