"""Every field honoured, reported or refused: X-miLLM-Ignored-Fields, X-miLLM-Strict, the matrix
before any model load, seeds and extra_messages."""

import http_sfv
import httpx
import pytest

from millm.v1.policy.field_policy import ENDPOINTS, MATRIX, REFUSED
from tests.api.clients import MODEL, post, sse_events
from tests.unit.test_field_policy import EXAMPLES

USER = [{"role": "user", "content": "Tell me about the river."}]
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
BASE = {
    "chat": {"messages": USER, "max_tokens": 2},
    "completions": {"prompt": "A river", "max_tokens": 2},
    "embeddings": {"input": "A river"},
}


def ignored(response) -> list[str] | None:
    header = response.headers.get("x-millm-ignored-fields")
    if header is None:
        return None
    parsed = http_sfv.List()
    parsed.parse(header.encode())
    return [entry.value for entry in parsed]


def refused_cells():
    for field, rules in MATRIX.items():
        for endpoint in ENDPOINTS:
            if rules[endpoint].verdict == REFUSED:
                yield pytest.param(field, endpoint, id=f"{field}-{endpoint}")


@pytest.mark.parametrize("field, endpoint", list(refused_cells()))
def test_refused_cells_before_any_model_is_looked_at(llama_server, field, endpoint):
    # A model name the server does not serve: the field refusal still comes first (no load, no 404).
    body = {**BASE[endpoint], "model": "some-other-model", field: EXAMPLES[field]}
    response = post(llama_server, PATHS[endpoint], body)
    assert response.status_code == 400, response.text
    assert (
        response.json()["error"]["code"] == "field_not_honoured"
        and response.json()["error"]["param"] == field
    )


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_neutral_values_everywhere(llama_server, endpoint):
    body = {
        **BASE[endpoint],
        "model": MODEL,
        "n": 1,
        "logprobs": False,
        "response_format": {"type": "text"},
        "tools": [],
        "logit_bias": {},
        "seed": None,
        "dimensions": None,
        "modalities": ["text"],
    }
    response = post(llama_server, PATHS[endpoint], body)
    assert response.status_code == 200, response.text
    assert ignored(response) is None


def test_unknown_and_unused_fields_are_named(llama_server, caplog):
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "user": "alice",
        "foo": {"secret": "value-42"},
        "messages": [{"role": "user", "content": "hi", "name": "bob", "weight": 3}],
        "extra_messages": [
            [{"role": "user", "content": "x"}, {"role": "user", "content": "y", "weight": 1}]
        ],
    }
    response = post(llama_server, "/v1/chat/completions", body)
    assert response.status_code == 200
    assert ignored(response) == [
        "foo",
        "messages[0].weight",
        "extra_messages[0][1].weight",
        "user",
        "messages[0].name",
    ]
    log = llama_server.log
    line = [entry for entry in log.splitlines() if "request_fields_unused" in entry][-1]
    assert "messages[0].weight" in line and "value-42" not in log and "alice" not in log


@pytest.mark.parametrize("tools", [None, []])
def test_tool_choice_without_tools_is_named_or_refused_in_strict_mode(llama_server, tools):
    body = {
        "model": MODEL,
        "messages": USER,
        "max_tokens": 2,
        "tool_choice": "auto",
        "tools": tools,
    }
    assert ignored(post(llama_server, "/v1/chat/completions", body)) == ["tool_choice"]
    strict = httpx.post(
        f"{llama_server.base_url}/v1/chat/completions", json=body, headers={"X-miLLM-Strict": "1"}
    )
    assert strict.status_code == 400 and strict.json()["error"]["param"] == "tool_choice"
    forced = {**body, "tool_choice": "required"}
    assert post(llama_server, "/v1/chat/completions", forced).json()["error"]["param"] == (
        "tool_choice"
    )


def test_header_on_streaming_responses_and_never_in_the_body(llama_server):
    body = {"model": MODEL, "messages": USER, "max_tokens": 3, "stream": True, "foo": 1}
    response = post(llama_server, "/v1/chat/completions", body)
    assert ignored(response) == ["foo"]
    assert "foo" not in response.text
    plain = post(
        llama_server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "max_tokens": 3, "stream": True},
    )
    assert ignored(plain) is None and sse_events(plain.text)[-1] == "[DONE]"


def test_cap_and_percent_encoding(llama_server):
    body = {
        "model": MODEL,
        "prompt": "x",
        "max_tokens": 1,
        **{f"unknown_field_{i:03d}": i for i in range(120)},
        "naïve": 1,
    }
    response = post(llama_server, "/v1/completions", body)
    header = response.headers["x-millm-ignored-fields"]
    assert len(header.encode()) <= 1024
    names = ignored(response)
    assert names[-1].startswith("+") and names[-1].endswith(" more")
    assert int(names[-1][1:].split()[0]) == 121 - (len(names) - 1)
    short = post(
        llama_server,
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "max_tokens": 1, "naïve": 1},
    )
    assert ignored(short) == ["na%C3%AFve"]


@pytest.mark.parametrize("value", ["true", "1"])
def test_strict_refuses_naming_every_location(llama_server, value):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi", "weight": 1}],
        "user": "u",
        "max_tokens": 2,
    }
    response = httpx.post(
        f"{llama_server.base_url}/v1/chat/completions", json=body, headers={"X-miLLM-Strict": value}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (
        error["code"] == "unused_fields_refused"
        and "messages[0].weight" in error["message"]
        and "user" in error["message"]
    )


@pytest.mark.parametrize("value, status", [("false", 200), ("0", 200), ("yes", 400)])
def test_strict_values(llama_server, value, status):
    response = httpx.post(
        f"{llama_server.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 1, "user": "u"},
        headers={"X-miLLM-Strict": value},
    )
    assert response.status_code == status
    if status == 400:
        assert response.json()["error"]["param"] == "X-miLLM-Strict"
    else:
        assert ignored(response) == ["user"]


def test_strict_passes_a_clean_request(llama_server):
    response = httpx.post(
        f"{llama_server.base_url}/v1/embeddings",
        json={"model": MODEL, "input": "x"},
        headers={"X-miLLM-Strict": "1"},
    )
    assert response.status_code == 200


def test_extra_messages_each_get_a_choice_in_order(llama_server):
    extras = [
        [{"role": "user", "content": "Hello"}],
        [{"role": "user", "content": "What is a cat?"}],
    ]
    both = post(
        llama_server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": USER,
            "extra_messages": extras,
            "max_tokens": 12,
            "temperature": 0,
        },
    ).json()
    assert [c["index"] for c in both["choices"]] == [0, 1, 2]
    for i, conversation in enumerate([USER, *extras]):
        alone = post(
            llama_server,
            "/v1/chat/completions",
            {"model": MODEL, "messages": conversation, "max_tokens": 12, "temperature": 0},
        ).json()
        assert both["choices"][i]["message"]["content"] == alone["choices"][0]["message"]["content"]


def test_seed_scopes(llama_server):
    extras = [[{"role": "user", "content": "Hello"}]]
    batch = post(
        llama_server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "extra_messages": extras, "max_tokens": 12, "seed": 9},
    )
    assert batch.headers["x-millm-seed"] == '9;scope="batch-shape"'
    again = post(
        llama_server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "extra_messages": extras, "max_tokens": 12, "seed": 9},
    )
    assert [c["message"] for c in again.json()["choices"]] == [
        c["message"] for c in batch.json()["choices"]
    ]
    scoring = post(
        llama_server,
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "max_tokens": 1, "logprobs": 1, "seed": 4},
    )
    assert scoring.headers["x-millm-seed"] == '4;scope="request"'
    greedy = post(
        llama_server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "max_tokens": 1, "temperature": 0, "seed": 0},
    )
    assert greedy.headers["x-millm-seed"] == '0;scope="request"'


def test_extra_messages_template_failure_names_the_conversation(llama_server):
    extras = [[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]]
    response = post(
        llama_server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "extra_messages": extras},
    )
    assert (
        response.status_code == 400
        and response.json()["error"]["param"] == "extra_messages[0][0].content[0]"
    )
