"""Every /v1 failure in OpenAI's error shape, with the spec's status and code (never FastAPI's
422)."""

import openai
import pytest

from tests.api.clients import MODEL, post, sdk

USER = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    "path, body, param",
    [
        (CHAT, {"messages": USER, "temperature": 2.5}, "temperature"),
        (CHAT, {"messages": USER, "temperature": "0.5"}, "temperature"),
        (CHAT, {"messages": USER, "top_p": 1.5}, "top_p"),
        (CHAT, {"messages": USER, "n": 0}, "n"),
        (CHAT, {"messages": USER, "max_tokens": 0}, "max_tokens"),
        (CHAT, {"messages": USER, "frequency_penalty": -2.5}, "frequency_penalty"),
        (CHAT, {"messages": USER, "presence_penalty": 3}, "presence_penalty"),
        (CHAT, {"messages": USER, "seed": True}, "seed"),
        (CHAT, {"messages": USER, "seed": -1}, "seed"),
        (CHAT, {"messages": USER, "seed": 2**32}, "seed"),
        (CHAT, {"messages": USER, "seed": 1.5}, "seed"),
        (CHAT, {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (CHAT, {"messages": USER, "stop": [""]}, "stop"),
        (CHAT, {"messages": USER, "stream": "yes"}, "stream"),
        (CHAT, {"messages": []}, "messages"),
        (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (CHAT, {"messages": [{"role": "user"}]}, "messages[0]"),
        (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (CHAT, {}, "messages"),
        (COMPLETIONS, {"prompt": []}, "prompt"),
        (COMPLETIONS, {"prompt": 5}, "prompt"),
        (COMPLETIONS, {}, "prompt"),
    ],
)
def test_invalid_fields_are_400_naming_the_field(llama_server, path, body, param):
    error = error_of(post(llama_server, path, {"model": MODEL, **body}), 400)
    assert error["code"] == "invalid_parameter" and error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param.split("[")[0] in error["message"]


def test_missing_model_is_400(llama_server):
    error = error_of(post(llama_server, CHAT, {"messages": USER}), 400)
    assert error["param"] == "model"


def test_body_that_is_not_json(llama_server):
    import httpx

    response = httpx.post(
        f"{llama_server.base_url}{CHAT}",
        content=b"{nope",
        headers={"content-type": "application/json"},
    )
    error = error_of(response, 400)
    assert "not valid JSON" in error["message"]


def test_both_budgets_differ_names_both(llama_server):
    error = error_of(
        post(
            llama_server,
            CHAT,
            {"model": MODEL, "messages": USER, "max_tokens": 5, "max_completion_tokens": 6},
        ),
        400,
    )
    assert "max_tokens" in error["message"] and "max_completion_tokens" in error["message"]


def test_equal_budgets_and_max_completion_tokens_alone_are_honoured(llama_server):
    both = post(
        llama_server,
        CHAT,
        {"model": MODEL, "messages": USER, "max_tokens": 4, "max_completion_tokens": 4},
    ).json()
    alone = post(
        llama_server, CHAT, {"model": MODEL, "messages": USER, "max_completion_tokens": 3}
    ).json()
    assert both["usage"]["completion_tokens"] <= 4 and alone["usage"]["completion_tokens"] <= 3
    if alone["choices"][0]["finish_reason"] == "length":
        assert alone["usage"]["completion_tokens"] == 3


def test_n_with_stream_is_refused(llama_server):
    error = error_of(
        post(llama_server, CHAT, {"model": MODEL, "messages": USER, "n": 2, "stream": True}), 400
    )
    assert error["param"] == "n" and error["code"] == "field_not_honoured"


def test_unknown_model_is_404_model_not_found(llama_server):
    with pytest.raises(openai.NotFoundError) as info:
        sdk(llama_server).chat.completions.create(model="gpt-4o", messages=USER)
    assert info.value.code == "model_not_found"
    error_of(post(llama_server, COMPLETIONS, {"model": "nope", "prompt": "x"}), 404)


@pytest.mark.parametrize("stream", [False, True])
def test_context_length_exceeded_before_any_stream(llama_server, stream):
    response = post(
        llama_server, CHAT, {"model": MODEL, "messages": USER, "max_tokens": 5000, "stream": stream}
    )
    error = error_of(response, 400)
    assert error["code"] == "context_length_exceeded"
    assert "2048" in error["message"] and "5000" in error["message"]
    assert not response.headers["content-type"].startswith("text/event-stream")


def test_prompt_alone_past_the_window(llama_server):
    error = error_of(
        post(llama_server, COMPLETIONS, {"model": MODEL, "prompt": "word " * 2100}), 400
    )
    assert error["code"] == "context_length_exceeded" and "2048" in error["message"]


def test_default_budget_shrinks_to_the_window(llama_server):
    prompt = [1] + [300] * 2039  # 2040 tokens: the default budget (512) shrinks to the 8 left
    response = post(
        llama_server, COMPLETIONS, {"model": MODEL, "prompt": prompt, "temperature": 0}
    ).json()
    assert response["usage"]["prompt_tokens"] == 2040
    assert response["usage"]["completion_tokens"] <= 8
    if response["choices"][0]["finish_reason"] == "length":
        assert response["usage"]["completion_tokens"] == 8


def test_token_ids_outside_vocabulary(llama_server):
    error = error_of(
        post(llama_server, COMPLETIONS, {"model": MODEL, "prompt": [1, 2, 100000]}), 400
    )
    assert error["param"] == "prompt" and "100000" in error["message"]


def test_prompt_that_tokenises_to_nothing(llama_server):
    error = error_of(
        post(
            llama_server, COMPLETIONS, {"model": MODEL, "prompt": "", "add_special_tokens": False}
        ),
        400,
    )
    assert error["param"] == "prompt"


def test_output_changing_field_not_honoured(llama_server):
    error = error_of(
        post(llama_server, CHAT, {"model": MODEL, "messages": USER, "logit_bias": {"5": 100}}), 400
    )
    assert error["code"] == "field_not_honoured" and error["param"] == "logit_bias"
    ok = post(
        llama_server,
        CHAT,
        {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 1,
            "logit_bias": {},
            "tools": [],
            "response_format": {"type": "text"},
            "logprobs": False,
            "n": 1,
        },
    )
    assert ok.status_code == 200


def test_image_content_is_not_honoured(llama_server):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "x"}},
            ],
        }
    ]
    error = error_of(post(llama_server, CHAT, {"model": MODEL, "messages": messages}), 400)
    assert error["param"] == "messages[0].content[1]" and error["code"] == "field_not_honoured"


def test_unknown_route_is_openai_shaped(llama_server):
    import httpx

    error = error_of(httpx.get(f"{llama_server.base_url}/v1/nothing-here"), 404)
    assert error["code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/chat/completions", {"POST"}),
        ("DELETE", "/v1/models", {"GET", "HEAD"}),
        ("PUT", "/api/saes", {"GET", "HEAD", "POST"}),
        ("PATCH", "/api/profiles/some-profile", {"DELETE", "GET", "HEAD", "PUT"}),
        # The documented resource, not also /api/profiles/{key} that the path matches too.
        ("PATCH", "/api/profiles/deactivate", {"POST"}),
    ],
)
def test_a_405_names_the_methods_the_path_takes(llama_server, method, path, allowed):
    """RFC 9110: a 405 carries Allow with the methods the target resource supports."""
    import httpx

    response = httpx.request(method, f"{llama_server.base_url}{path}")
    assert error_of(response, 405)["code"] == "method_not_allowed"
    assert set(response.headers["allow"].split(", ")) == allowed


def test_whole_number_floats_are_the_integers_the_schema_calls_them(llama_server):
    """JSON Schema counts 2.0 as an integer, so wherever the schema says integer the server reads
    2.0 as 2; 2.5 stays a refusal naming the field."""
    import httpx

    base = {"model": MODEL, "messages": USER, "temperature": 0, "logprobs": True}
    ints = post(llama_server, CHAT, {**base, "max_tokens": 3, "seed": 7, "n": 1, "top_logprobs": 2})
    whole = post(
        llama_server, CHAT, {**base, "max_tokens": 3.0, "seed": 7.0, "n": 1.0, "top_logprobs": 2.0}
    )
    assert ints.status_code == whole.status_code == 200, whole.text
    assert whole.json()["usage"]["completion_tokens"] == 3
    assert whole.json()["choices"][0]["message"] == ints.json()["choices"][0]["message"]
    assert len(whole.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    # greedy: a sampled answer may end at its first token one time and not the other
    one = {"model": MODEL, "max_tokens": 2, "temperature": 0}
    ids = post(llama_server, COMPLETIONS, {**one, "prompt": [5, 9]})
    floats = post(llama_server, COMPLETIONS, {**one, "prompt": [5.0, 9.0]})
    assert floats.json()["usage"] == ids.json()["usage"]
    assert error_of(post(llama_server, CHAT, {**base, "max_tokens": 2.5}), 400)["param"] == (
        "max_tokens"
    )
    assert error_of(post(llama_server, COMPLETIONS, {"model": MODEL, "prompt": 5.0}), 400)[
        "param"
    ] == ("prompt")
    schema = httpx.get(f"{llama_server.base_url}/openapi.json").json()["components"]["schemas"]
    assert "integer" in str(schema["ChatCompletionRequest"]["properties"]["max_tokens"])
