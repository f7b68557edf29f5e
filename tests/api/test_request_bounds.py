"""Rows per request are bounded (MAX_ROWS_PER_REQUEST): past the bound a 400 names the field
that multiplies them, before any model is touched; at the bound the request is served."""

from __future__ import annotations

import pytest

from tests.api.clients import MODEL, error, post
from tests.support.server import ServerProcess

CAP = 4


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("bounds"),
        ["--model", str(tiny_dirs["llama"])],
        env={"MILLM_MAX_ROWS_PER_REQUEST": str(CAP)},
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def chat(n: int, extra: int, model: str = MODEL) -> dict:
    conversation = [{"role": "user", "content": "Hello"}]
    return {
        "model": model,
        "messages": conversation,
        "extra_messages": [conversation] * extra or None,
        "n": n,
        "max_tokens": 2,
    }


def test_conversations_times_n_past_the_bound_is_refused_naming_extra_messages(server):
    body = error(post(server, "/v1/chat/completions", chat(n=3, extra=1)), 400, "invalid_parameter")
    assert body["param"] == "extra_messages"
    assert (
        "6 rows (2 conversations x n=3)" in body["message"] and f"at most {CAP}" in body["message"]
    )


def test_n_alone_past_the_bound_is_refused_naming_n(server):
    body = error(
        post(server, "/v1/chat/completions", chat(n=CAP + 1, extra=0)), 400, "invalid_parameter"
    )
    assert body["param"] == "n"


def test_prompts_times_n_past_the_bound_is_refused_naming_prompt(server):
    response = post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": ["a", "b", "c"], "n": 1, "max_tokens": 2},
    )
    assert response.status_code == 200 and len(response.json()["choices"]) == 3
    body = error(
        post(
            server,
            "/v1/completions",
            {"model": MODEL, "prompt": ["a", "b", "c", "d", "e"], "max_tokens": 2},
        ),
        400,
        "invalid_parameter",
    )
    assert body["param"] == "prompt" and "5 rows" in body["message"]


def test_the_bound_is_checked_before_the_model_name(server):
    # A request-only refusal: an unknown model is not even looked at.
    body = error(
        post(server, "/v1/chat/completions", chat(n=3, extra=1, model="no-such-model")),
        400,
        "invalid_parameter",
    )
    assert body["param"] == "extra_messages"


def test_exactly_the_bound_is_served(server):
    response = post(server, "/v1/chat/completions", chat(n=2, extra=1))
    assert response.status_code == 200
    assert len(response.json()["choices"]) == 4
