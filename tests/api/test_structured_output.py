"""response_format on a live server: documents validate, the header names the constraint,
refusals before load."""

import json

import pytest
from jsonschema import Draft202012Validator

from tests.api.clients import MODEL, post, sdk

USER = [{"role": "user", "content": "Classify: why did the chicken cross the road?"}]
JUDGE = {
    "type": "json_schema",
    "json_schema": {
        "name": "judge_v1",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "label": {"enum": ["humor", "not_humor"]},
                "score": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["label", "score"],
            "additionalProperties": False,
        },
    },
}


def ask(server, **extra):
    return post(
        server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "max_tokens": 100, "temperature": 1.0, **extra},
    )


def test_json_schema_output_validates_for_every_choice(llama_server):
    response = ask(llama_server, response_format=JUDGE, n=3, seed=1)
    assert response.status_code == 200, response.text
    assert response.headers["x-millm-constrained"] == 'json_schema;name="judge_v1"'
    validator = Draft202012Validator(JUDGE["json_schema"]["schema"])
    closed = 0
    for choice in response.json()["choices"]:
        if choice["finish_reason"] == "stop":
            closed += 1
            assert not list(validator.iter_errors(json.loads(choice["message"]["content"])))
    assert closed >= 1


def test_strict_false_is_still_enforced_and_extra_messages_too(llama_server):
    lenient = {**JUDGE, "json_schema": {**JUDGE["json_schema"], "strict": False}}
    response = ask(
        llama_server,
        response_format=lenient,
        extra_messages=[[{"role": "user", "content": "And this one?"}]],
        seed=2,
    )
    assert len(response.json()["choices"]) == 2
    for choice in response.json()["choices"]:
        if choice["finish_reason"] == "stop":
            assert json.loads(choice["message"]["content"])["label"] in ("humor", "not_humor")


def test_json_object_with_the_sdk(llama_server):
    raw = sdk(llama_server).chat.completions.with_raw_response.create(
        model=MODEL, messages=USER, max_tokens=100, response_format={"type": "json_object"}, seed=3
    )
    assert raw.headers["x-millm-constrained"] == "json_object"
    choice = raw.parse().choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


@pytest.mark.parametrize(
    "extra, code",
    [
        ({"stream": True}, "response_format_unsupported"),
        ({"stop": ["}"]}, "response_format_unsupported"),
        ({"logprobs": True, "max_tokens": 1}, "response_format_unsupported"),
        ({"allowed_token_ids": [1, 2], "max_tokens": 1}, "response_format_unsupported"),
    ],
)
def test_refused_combinations_before_any_model_lookup(llama_server, extra, code):
    body = {"model": "not-a-served-model", "messages": USER, "response_format": JUDGE, **extra}
    response = post(llama_server, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    assert (
        response.json()["error"]["code"] == code
        and response.json()["error"]["param"] == "response_format"
    )


@pytest.mark.parametrize(
    "path, body", [("/v1/completions", {"prompt": "x"}), ("/v1/embeddings", {"input": "x"})]
)
def test_refused_endpoints(llama_server, path, body):
    response = post(
        llama_server, path, {"model": MODEL, **body, "response_format": {"type": "json_object"}}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"


def test_unsupported_keywords_and_bad_formats(llama_server):
    bad = {
        "type": "json_schema",
        "json_schema": {
            "name": "n",
            "schema": {
                "type": "object",
                "properties": {"age": {"type": "integer", "multipleOf": 2}},
                "not": {},
            },
        },
    }
    error = ask(llama_server, response_format=bad).json()["error"]
    assert error["code"] == "response_format_unsupported"
    assert (
        "multipleOf at /properties/age/multipleOf" in error["message"]
        and "not at /not" in error["message"]
    )
    for fmt, message in [
        ({"type": "xml"}, "type 'xml'"),
        ({"type": "json_schema"}, "needs a json_schema object"),
        (
            {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
            "name is required",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}},
            "name is required",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": {"type": "string", "pattern": "("}},
            },
            "cannot be compiled",
        ),
    ]:
        error = ask(llama_server, response_format=fmt).json()["error"]
        assert error["code"] == "response_format_unsupported" and message in error["message"], error


def test_text_is_neutral_and_description_is_reported(llama_server):
    plain = ask(llama_server, response_format={"type": "text"}, max_tokens=3)
    assert plain.status_code == 200 and "x-millm-constrained" not in plain.headers
    described = {**JUDGE, "json_schema": {**JUDGE["json_schema"], "description": "a judge"}}
    response = ask(llama_server, response_format=described, max_tokens=40)
    assert "response_format.json_schema.description" in response.headers["x-millm-ignored-fields"]
