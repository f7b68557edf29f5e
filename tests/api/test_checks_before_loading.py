"""A bad request naming a registered model that is not loaded is refused before that model is
loaded: the model everyone is using stays loaded and answering."""

import pytest

from tests.api.clients import MODEL, api, error
from tests.support.server import ServerProcess

OTHER = "tiny-llama-plain"
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("precheck-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        process.wait_ready()
        assert (
            api(
                process, "POST", "/api/models", json={"source": str(tiny_dirs["llama-plain"])}
            ).status_code
            == 201
        )
        yield process
    finally:
        process.stop()


def states(server) -> dict[str, str]:
    return {m["id"]: m["state"] for m in api(server, "GET", "/api/models").json()["data"]}


CHAT = {"model": OTHER, "messages": USER, "max_tokens": 2}
CASES = [
    ("/v1/chat/completions", CHAT, {"X-miLLM-Strict": "yes"}, 400, "invalid_header"),
    (
        "/v1/chat/completions",
        {**CHAT, "user": "u1"},
        {"X-miLLM-Strict": "true"},
        400,
        "unused_fields_refused",
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "colour": "blue"},
        {"X-miLLM-Strict": "1"},
        400,
        "unused_fields_refused",
    ),
    ("/v1/chat/completions", {**CHAT, "steering_intensity": "loud"}, {}, 400, "invalid_parameter"),
    ("/v1/chat/completions", {**CHAT, "steering_intensity": 2.5}, {}, 400, "invalid_parameter"),
    ("/v1/chat/completions", {**CHAT, "profile": "no-such-profile"}, {}, 404, "profile_not_found"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, {}, 400, "invalid_parameter"),
    (
        "/v1/chat/completions",
        {**CHAT, "return_sae_activations": {"colour": 1}},
        {},
        400,
        "invalid_parameter",
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "return_sae_activations": {"positions": "middle"}},
        {},
        400,
        "invalid_parameter",
    ),
    ("/v1/chat/completions", {**CHAT, "n": 2, "stream": True}, {}, 400, "field_not_honoured"),
    (
        "/v1/completions",
        {"model": OTHER, "prompt": "a", "response_format": {"type": "json_object"}},
        {},
        400,
        "field_not_honoured",
    ),
    (
        "/v1/completions",
        {"model": OTHER, "prompt": "a", "foo": 1},
        {"X-miLLM-Strict": "true"},
        400,
        "unused_fields_refused",
    ),
    ("/v1/embeddings", {"model": OTHER, "input": "a", "seed": 3}, {}, 400, "field_not_honoured"),
    (
        "/v1/embeddings",
        {"model": OTHER, "input": "a", "user": "u"},
        {"X-miLLM-Strict": "true"},
        400,
        "unused_fields_refused",
    ),
    ("/v1/embeddings", {"model": OTHER, "input": ["a", ""]}, {}, 400, "invalid_parameter"),
    ("/v1/embeddings", {"model": OTHER, "input": "a", "pooling": "max"}, {}, 400, None),
    # A good request that forbids the load it would need.
    ("/v1/chat/completions", CHAT, {"X-miLLM-Load-Policy": "refuse"}, 409, "model_not_resident"),
    (
        "/v1/completions",
        {"model": OTHER, "prompt": "a"},
        {"X-miLLM-Load-Policy": "REFUSE"},
        409,
        "model_not_resident",
    ),  # fmt: skip
    (
        "/v1/embeddings",
        {"model": OTHER, "input": "a"},
        {"X-miLLM-Load-Policy": "refuse"},
        409,
        "model_not_resident",
    ),  # fmt: skip
    ("/v1/chat/completions", CHAT, {"X-miLLM-Load-Policy": "sometimes"}, 400, "invalid_header"),
]


@pytest.mark.parametrize("path, body, headers, status, code", CASES)
def test_a_bad_request_never_moves_a_model(server, path, body, headers, status, code):
    error(api(server, "POST", path, json=body, headers=headers), status, code)
    assert states(server) == {MODEL: "loaded", OTHER: "ready"}
    answer = api(
        server,
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 2},
    )
    assert answer.status_code == 200, answer.text


def test_refusing_a_load_names_both_models_and_the_loaded_one_still_answers(server):
    refused = api(
        server, "POST", "/v1/chat/completions", json=CHAT, headers={"X-miLLM-Load-Policy": "refuse"}
    ).json()["error"]
    assert refused["param"] == "model" and f"'{OTHER}' is not loaded" in refused["message"]
    assert f"the loaded model is '{MODEL}'" in refused["message"]
    body = {"model": MODEL, "messages": USER, "max_tokens": 2}
    headers = {"X-miLLM-Load-Policy": "refuse"}
    answer = api(server, "POST", "/v1/chat/completions", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    header = api(
        server, "POST", "/v1/chat/completions", json=body, headers={"X-miLLM-Load-Policy": "x"}
    )
    assert header.json()["error"]["param"] == "X-miLLM-Load-Policy"


def test_a_good_request_for_the_other_model_does_load_it(server):
    # The control: the same requests, corrected, would have loaded the other model.
    assert (
        api(
            server, "POST", "/v1/chat/completions", json=CHAT, headers={"X-miLLM-Strict": "true"}
        ).status_code
        == 200
    )
    assert states(server) == {MODEL: "ready", OTHER: "loaded"}
