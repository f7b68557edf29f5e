"""/v1/responses on a live server (a tiny Llama whose chat template takes tools, with a tiny SAE
attached): the official SDK whole and streamed, function tools, structured output, stored
responses and previous_response_id, steering and SAE reads as on chat, the field policy, a
failure partway through a stream, and the OpenAI Agents SDK running an agent with a tool."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Literal

import httpx
import pytest
from jsonschema import Draft202012Validator
from openai import OpenAI
from pydantic import BaseModel, Field

from tests.api.clients import api, error, post
from tests.api.test_request_policy import ignored
from tests.support import tiny_models
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens

MODEL = "tiny-tools"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CHAT_WEATHER = {
    "type": "function",
    "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("responses-model")
    tiny_models.build_tokenizer(base / "tokenizer", chat_template=tiny_models.TOOLS_TEMPLATE)
    directory = tiny_models.build_llama(base / MODEL, base / "tokenizer", seed=3)
    sae_dir = build_saelens(base / "sae", layer=1, seed=11)
    process = ServerProcess(
        tmp_path_factory.mktemp("responses-home"),
        ["--model", str(directory)],
        env={"GRACEFUL_UNLOAD_TIMEOUT": "0.5"},
        allowed=[base],
    )
    try:
        process.wait_ready()
        sae = api(process, "POST", "/api/saes", json={"path": str(sae_dir)}).json()["id"]
        api(process, "POST", f"/api/saes/{sae}/attach").raise_for_status()
        process.sae = sae
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(server) -> OpenAI:
    return OpenAI(
        base_url=f"{server.base_url}/v1", api_key="not-needed", max_retries=0, timeout=120
    )


def respond(server, **body) -> httpx.Response:
    return post(server, "/v1/responses", {"model": MODEL, **body})


def chat(server, **body) -> httpx.Response:
    return post(server, "/v1/chat/completions", {"model": MODEL, **body})


def events_of(text: str) -> list[dict]:
    """The Responses stream: `event:` names each frame, the data repeats it as `type`; no [DONE]."""
    events = []
    for frame in text.strip().split("\n\n"):
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), frame
        event = json.loads(data[len("data: ") :])
        assert event["type"] == name[len("event: ") :]
        events.append(event)
    return events


# answers as chat gives them -----------------------------------------------------------------------
def test_a_response_is_the_chat_answer_in_other_words(server, client):
    response = client.responses.create(
        model=MODEL,
        instructions="Be brief.",
        input=ASK,
        max_output_tokens=6,
        temperature=0.7,
        extra_body={"seed": 5},
    )
    same = chat(
        server,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}],
        max_tokens=6,
        temperature=0.7,
        seed=5,
    ).json()
    assert (
        response.id.startswith("resp_")
        and response.object == "response"
        and response.model == MODEL
    )
    assert response.output_text == same["choices"][0]["message"]["content"] != ""
    assert (response.status, response.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert response.output[0].type == "message" and response.output[0].id.startswith("msg_")
    assert (
        response.usage.input_tokens,
        response.usage.output_tokens,
        response.usage.total_tokens,
    ) == (same["usage"]["prompt_tokens"], 6, same["usage"]["prompt_tokens"] + 6)
    assert (
        response.instructions == "Be brief."
        and response.temperature == 0.7
        and response.max_output_tokens == 6
        and response.store is True
    )


def test_a_stream_is_the_event_sequence_of_the_whole_answer(server, client):
    whole = respond(server, input=ASK, max_output_tokens=7, seed=9)
    streamed = respond(server, input=ASK, max_output_tokens=7, seed=9, stream=True)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith(
        "text/event-stream"
    )
    assert streamed.headers["x-millm-steering"] == whole.headers["x-millm-steering"]
    events = events_of(streamed.text)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert (
        text
        == events[-4]["text"]
        == final["output"][0]["content"][0]["text"]
        == whole.json()["output"][0]["content"][0]["text"]
    )
    counts = ("input_tokens", "output_tokens", "total_tokens")
    assert [final["usage"][k] for k in counts] == [
        whole.json()["usage"][k] for k in counts
    ] and final["status"] == "incomplete"
    # the same prompt again: the prefix cache served it
    assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0
    # The SDK's stream helper reassembles the same text from the events.
    with client.responses.stream(
        model=MODEL, input=ASK, max_output_tokens=7, extra_body={"seed": 9}
    ) as stream:
        deltas = [e.snapshot for e in stream if e.type == "response.output_text.delta"]
    assert deltas[-1] == text


# function tools -----------------------------------------------------------------------------------
def test_forced_call_then_its_output_round_trip(server, client):
    called = client.responses.create(
        model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=80
    )
    assert called.status == "completed" and [item.type for item in called.output] == [
        "function_call"
    ]
    call = called.output[0]
    assert (
        call.name == "get_weather"
        and call.call_id.startswith("call_")
        and call.id.startswith("fc_")
    )
    assert not list(
        Draft202012Validator(WEATHER["parameters"]).iter_errors(json.loads(call.arguments))
    )
    # Sending the call and its output back, whole or after previous_response_id, is the chat
    # conversation with a tool turn.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    explicit = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), output],
        tools=[WEATHER],
        max_output_tokens=3,
        extra_body={"seed": 1},
    )
    continued = client.responses.create(
        model=MODEL,
        previous_response_id=called.id,
        input=[output],
        tools=[WEATHER],
        max_output_tokens=3,
        extra_body={"seed": 1},
    )
    as_chat = chat(
        server,
        tools=[CHAT_WEATHER],
        max_tokens=3,
        seed=1,
        messages=[
            {"role": "user", "content": ASK},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"},
        ],
    ).json()
    assert (
        explicit.usage.input_tokens
        == continued.usage.input_tokens
        == as_chat["usage"]["prompt_tokens"]
    )
    assert (
        explicit.output_text
        == continued.output_text
        == (as_chat["choices"][0]["message"]["content"] or "")
    )
    assert continued.previous_response_id == called.id


def test_a_streamed_call_completes_for_the_sdk(client):
    with client.responses.stream(
        model=MODEL,
        input=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=80,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert (
        "response.function_call_arguments.delta" in kinds
        and "response.function_call_arguments.done" in kinds
        and kinds[-1] == "response.completed"
    )
    assert final.status == "completed" and final.output[0].type == "function_call"
    assert "city" in json.loads(final.output[0].arguments)


class City(BaseModel):
    name: str = Field(max_length=10)
    rainy: bool


def test_structured_output_through_text_format(client):
    parsed = client.responses.parse(
        model=MODEL, input="Describe Paris.", text_format=City, max_output_tokens=400
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)
    assert json.loads(parsed.output_text) == parsed.output_parsed.model_dump()


# stored responses ---------------------------------------------------------------------------------
def test_stored_responses_get_list_delete_and_store_false(server, client):
    first = client.responses.create(
        model=MODEL, input="One", max_output_tokens=2, metadata={"run": "r1"}
    )
    second = client.responses.create(
        model=MODEL, input="Two", previous_response_id=first.id, max_output_tokens=2
    )
    fetched = api(server, "GET", f"/v1/responses/{second.id}").json()
    assert (
        fetched == second.model_dump(mode="json", exclude_unset=True) | fetched
        and fetched["output"][0]["content"][0]["text"] == second.output_text
    )
    assert client.responses.retrieve(first.id).metadata == {"run": "r1"}
    # The conversation the second answered: its input, after the first's input and output.
    items = client.responses.input_items.list(second.id, order="asc")
    assert [(i.type, i.role) for i in items.data] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert items.data[1].content[0].text == first.output_text
    page = api(
        server,
        "GET",
        f"/v1/responses/{second.id}/input_items",
        params={"limit": 1, "order": "asc", "after": items.data[0].id},
    ).json()
    assert [i["id"] for i in page["data"]] == [items.data[1].id] and page["has_more"] is True
    assert api(server, "DELETE", f"/v1/responses/{first.id}").json() == {
        "id": first.id,
        "object": "response.deleted",
        "deleted": True,
    }
    error(api(server, "GET", f"/v1/responses/{first.id}"), 404, "response_not_found")
    error(api(server, "DELETE", f"/v1/responses/{first.id}"), 404, "response_not_found")
    gone = error(
        respond(server, input="Three", previous_response_id=first.id), 404, "response_not_found"
    )
    assert gone["param"] == "previous_response_id"
    # The second keeps its own copy of the conversation.
    assert (
        respond(
            server, input="Three", previous_response_id=second.id, max_output_tokens=1
        ).status_code
        == 200
    )
    unstored = respond(server, input="Four", store=False, max_output_tokens=1).json()
    assert unstored["store"] is False
    error(api(server, "GET", f"/v1/responses/{unstored['id']}"), 404, "response_not_found")
    error(api(server, "GET", f"/v1/responses/{second.id}/input_items", params={"limit": 0}), 400)


# millm's extensions -------------------------------------------------------------------------------
def test_steering_and_sae_reads_work_as_on_chat(server):
    sae = server.sae
    ask = {"input": ASK, "max_output_tokens": 8, "temperature": 0}
    plain = respond(server, **ask)
    assert plain.headers["x-millm-steering"] == "none"
    version = api(
        server, "PUT", f"/api/steering/saes/{sae}/features/0", json={"strength": 60}
    ).json()["steering"]["version"]
    try:
        steered = respond(server, **ask)
        as_chat = chat(
            server, messages=[{"role": "user", "content": ASK}], max_tokens=8, temperature=0
        )
        assert steered.headers["x-millm-steering"] == as_chat.headers["x-millm-steering"]
        assert member(steered.headers["x-millm-steering"])[1]["version"] == version
        text = steered.json()["output"][0]["content"][0]["text"]
        assert (
            text
            == as_chat.json()["choices"][0]["message"]["content"]
            != plain.json()["output"][0]["content"][0]["text"]
        )
        off = respond(server, **ask, steering_intensity="off")
        assert (
            off.headers["x-millm-steering"].startswith("none")
            and off.json()["output"][0]["content"][0]["text"]
            == plain.json()["output"][0]["content"][0]["text"]
        )
        read = {"sae_id": sae, "positions": "last", "top_k": 3}
        mine = respond(server, **ask, return_sae_activations=read).json()["millm"][
            "sae_activations"
        ]
        theirs = chat(
            server,
            messages=[{"role": "user", "content": ASK}],
            max_tokens=8,
            temperature=0,
            return_sae_activations=read,
        ).json()["millm"]["sae_activations"]
        assert mine == theirs and mine["positions"]
        # Probes (inline) give chat's verdicts; streamed, the SAE read and the verdicts arrive in
        # the last event's response.
        probes = [
            {
                "name": "p",
                "detector": {"type": "feature", "sae_id": sae, "index": 3, "threshold": 0.5},
            }
        ]
        verdicts = respond(server, **ask, probes=probes).json()["millm"]["probes"]
        assert (
            verdicts
            == chat(
                server,
                messages=[{"role": "user", "content": ASK}],
                max_tokens=8,
                temperature=0,
                probes=probes,
            ).json()["millm"]["probes"]
        )
        last = events_of(
            respond(server, **ask, probes=probes, return_sae_activations=read, stream=True).text
        )[-1]
        assert (
            last["type"] == "response.incomplete"
            and last["response"]["millm"]["probes"] == verdicts
        )
        streamed = last["response"]["millm"]["sae_activations"]
        # The streamed read runs on another forward path (cached prefix): the same features, values
        # to float32 rounding.
        for got, want in zip(streamed["positions"], mine["positions"], strict=True):
            assert [f["index"] for f in got["features"]] == [f["index"] for f in want["features"]]
            assert [f["value"] for f in got["features"]] == pytest.approx(
                [f["value"] for f in want["features"]], rel=1e-5
            )
    finally:
        api(server, "DELETE", "/api/steering/features")


# the field policy ---------------------------------------------------------------------------------
def test_ignored_fields_are_named_in_responses_words_and_strict_refuses_them(server):
    body = {
        "input": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "user", "content": "Hi", "weight": 2},
        ],
        "reasoning": {"effort": "high"},
        "text": {"verbosity": "low"},
        "foo": 1,
        "user": "alice",
        "max_output_tokens": 1,
    }
    response = respond(server, **body)
    assert response.status_code == 200, response.text
    assert ignored(response) == [
        "foo",
        "input[1].weight",
        "user",
        "reasoning",
        "text.verbosity",
        "input[0]",
    ]
    refused = error(
        post(server, "/v1/responses", {"model": MODEL, **body}, headers={"X-miLLM-Strict": "true"}),
        400,
        "unused_fields_refused",
    )
    assert refused["param"] == "foo"
    neutral = respond(
        server,
        input="Hi",
        max_output_tokens=1,
        background=False,
        include=[],
        truncation="disabled",
        top_logprobs=0,
    )
    assert neutral.status_code == 200 and ignored(neutral) is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("background", True),
        ("include", ["message.output_text.logprobs"]),
        ("truncation", "auto"),
        ("top_logprobs", 2),
        ("conversation", "conv_1"),
        ("prompt", {"id": "pmpt_1"}),
    ],
)
def test_fields_millm_cannot_honour_are_refused(server, field, value):
    body = error(respond(server, input="Hi", **{field: value}), 400, "field_not_honoured")
    assert body["param"] == field


@pytest.mark.parametrize(
    "body, status, code, param",
    [
        ({"tools": [{"type": "web_search"}]}, 400, "field_not_honoured", "tools[0].type"),
        (
            {"tools": [{"type": "function", "name": "bad name"}]},
            400,
            "invalid_parameter",
            "tools[0].name",
        ),
        ({"tool_choice": {"type": "file_search"}}, 400, "field_not_honoured", "tool_choice"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/y.png"}],
                    }
                ]
            },
            400,
            "field_not_honoured",
            "input[0].content[0]",
        ),
        (
            {"input": [{"type": "item_reference", "id": "msg_1"}]},
            400,
            "field_not_honoured",
            "input[0].type",
        ),
        ({"input": []}, 400, "invalid_parameter", "input"),
        (
            {
                "instructions": "only this",
                "input": [{"type": "function_call_output", "call_id": "c", "output": 3}],
            },
            400,
            "invalid_parameter",
            None,
        ),
        ({"max_output_tokens": 5000}, 400, "context_length_exceeded", "input"),
        (
            {"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            400,
            "response_format_unsupported",
            "text.format.name",
        ),
        (
            {"text": {"format": {"type": "json_object"}}, "stream": True},
            400,
            "response_format_unsupported",
            "text.format",
        ),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "invalid_parameter", "metadata"),
        ({"previous_response_id": "resp_never"}, 404, "response_not_found", "previous_response_id"),
        ({"profile": "no-such-profile"}, 404, "profile_not_found", "profile"),
    ],
)
def test_bad_requests_name_the_responses_field(server, body, status, code, param):
    found = error(respond(server, **{"input": "Hi", **body}), status, code)
    if param is not None:
        assert found["param"] == param, found
    assert "messages" not in found["message"] and "response_format" not in found["message"], found


LONG_CALL = {
    "type": "function",
    "name": "record",
    "parameters": {
        "type": "object",
        "properties": {"values": {"type": "array", "items": {"type": "integer"}, "minItems": 400}},
        "required": ["values"],
    },
}


def test_a_failure_partway_is_an_error_event_then_failed(server):
    # A forced call that cannot close before ~800 tokens runs to its budget, the whole window the
    # prompt leaves (about 1,700 tokens: 6 s of constrained decoding on the fastest CPU tried, an
    # AMD Zen 5), so it is still running when an unload with a 0.5 s grace fails it (model_busy), as
    # it fails chat's streams.
    events: list[dict] = []
    started = threading.Event()

    def read():
        with httpx.stream(
            "POST",
            f"{server.base_url}/v1/responses",
            timeout=120,
            json={
                "model": MODEL,
                "input": ASK,
                "max_output_tokens": tiny_models.CONTEXT - 400,
                "stream": True,
                "tools": [LONG_CALL],
                "tool_choice": "required",
            },
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: ") :]))
                    if events[-1]["type"] == "response.in_progress":
                        started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(60)
    assert api(server, "POST", f"/api/models/{MODEL}/unload").status_code == 200
    reader.join(60)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ], events[-3:]
    assert events[-2]["code"] == "model_busy" and events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "model_busy"
    # the next request loads the model again
    assert respond(server, input="Hi", max_output_tokens=1).status_code == 200


# the OpenAI Agents SDK ----------------------------------------------------------------------------
CITIES = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory):
    """The tools model, ending its free text within a few tokens: every token the forced call
    `{"name": "get_weather", "arguments": {"city": "Paris"|"Rome"}}` can never use also ends
    generation, so a random model's answer after the tool's output completes (the Agents SDK
    treats a cut answer as a failure)."""
    base = tmp_path_factory.mktemp("agent-model")
    tiny_models.build_tokenizer(base / "tokenizer", chat_template=tiny_models.TOOLS_TEMPLATE)
    directory = tiny_models.build_llama(base / "plain", base / "tokenizer", seed=3)
    vocab = json.loads((base / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    usable = set('{}":, ' + "name get_weather arguments city Paris Rome")
    enders = [
        i
        for token, i in vocab.items()
        if i > tiny_models.EOS_ID and not set(token.replace("Ġ", " ")) <= usable
    ]
    directory = tiny_models.with_extra_eos(base / MODEL, directory, enders)
    process = ServerProcess(tmp_path_factory.mktemp("agent-home"), ["--model", str(directory)])
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def test_an_agent_with_one_function_tool_runs_against_millm(agent_server):
    server = agent_server
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # tracing would upload to OpenAI
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    async def run():
        openai_client = AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key="not-needed", max_retries=0
        )
        model = OpenAIResponsesModel(model=MODEL, openai_client=openai_client)
        # "required" forces the first turn's call; the SDK then resets it to auto, so the second
        # turn answers.
        agent = Agent(
            name="weather",
            instructions="Answer with the weather.",
            tools=[get_weather],
            model=model,
            model_settings=ModelSettings(tool_choice="required", max_tokens=200, temperature=0.0),
        )
        return await Runner.run(agent, ASK, max_turns=3)

    began = time.monotonic()
    result = asyncio.run(run())
    assert len(calls) == 1 and isinstance(calls[0], str)
    kinds = [item.type for item in result.new_items]
    assert (
        kinds[:2] == ["tool_call_item", "tool_call_output_item"]
        and kinds[-1] == "message_output_item"
    )
    assert result.new_items[1].output == f"Sunny in {calls[0]}"
    assert isinstance(result.final_output, str) and len(result.raw_responses) == 2
    # The second turn answered the conversation with the tool's output in it: more input than the
    # first.
    assert result.raw_responses[1].usage.input_tokens > result.raw_responses[0].usage.input_tokens
    assert time.monotonic() - began < 60


def test_langchain_with_use_responses_api(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="not-needed",
        model=MODEL,
        use_responses_api=True,
        max_tokens=6,
        temperature=0,
        max_retries=0,
    )
    message = llm.invoke(ASK)
    same = chat(
        server, messages=[{"role": "user", "content": ASK}], max_tokens=6, temperature=0
    ).json()
    assert message.text == same["choices"][0]["message"]["content"] != ""
    assert message.usage_metadata["input_tokens"] == same["usage"]["prompt_tokens"]
    called = (
        llm.model_copy(update={"max_tokens": 80})
        .bind_tools([CHAT_WEATHER], tool_choice="get_weather")
        .invoke(ASK)
    )
    assert [call["name"] for call in called.tool_calls] == [
        "get_weather"
    ] and "city" in called.tool_calls[0]["args"]
