"""Which locations of a parsed body a request path does not use."""

import pytest

from millm.v1.http.headers import string_list
from millm.v1.policy.field_policy import template_kwargs_unused, template_reads, unused_locations
from millm.v1.serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    "body, scoring_reads, expected",
    [
        ({"messages": [USER]}, set(), []),
        ({"messages": [USER], "foo": 1}, set(), ["foo"]),
        ({"messages": [USER], "foo": None}, set(), []),  # an explicit null changes nothing
        ({"messages": [USER], "user": "u1"}, set(), ["user"]),
        (
            {"messages": [USER, {"role": "user", "content": "x", "name": "bob"}]},
            set(),
            ["messages[1].name"],
        ),
        ({"messages": [USER, {"role": "user", "content": "x", "name": "bob"}]}, {"name"}, []),
        (
            {"messages": [{"role": "user", "content": "x", "weight": 2}]},
            set(),
            ["messages[0].weight"],
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x", "cache_control": {}}],
                    }
                ]
            },
            set(),
            ["messages[0].content[0].cache_control"],
        ),
        (
            {
                "messages": [USER],
                "extra_messages": [[USER], [USER, {"role": "user", "content": "y", "weight": 1}]],
            },
            set(),
            ["extra_messages[1][1].weight"],
        ),
        (
            {"messages": [USER], "stream_options": {"include_usage": True}},
            set(),
            ["stream_options"],
        ),
        (
            {"messages": [USER], "stream": True, "stream_options": {"include_usage": True}},
            set(),
            [],
        ),
        ({"messages": [USER], "tools": [], "logit_bias": {}, "n": 1}, set(), []),  # neutral values
        ({"messages": [USER], "naïve": 1}, set(), ["na%C3%AFve"]),
        (
            {"messages": [USER], "return_tokens_as_token_ids": True},
            set(),
            ["return_tokens_as_token_ids"],
        ),
    ],
)
def test_chat_generation(body, scoring_reads, expected):
    parsed = ChatCompletionRequest.model_validate({"model": "m", **body})
    assert unused_locations(parsed, scoring=False, reads=scoring_reads) == expected


def test_scoring_reports_the_sampling_fields_it_does_not_apply():
    body = {
        "model": "m",
        "prompt": "x",
        "max_tokens": 1,
        "logprobs": 2,
        "top_p": 0.5,
        "stop": ["a"],
        "presence_penalty": 1,
        "temperature": 0.5,
        "seed": 3,
    }
    parsed = CompletionRequest.model_validate(body)
    assert unused_locations(parsed, scoring=parsed.scoring) == ["top_p", "stop", "presence_penalty"]


def test_embeddings_user_is_reported():
    parsed = EmbeddingRequest.model_validate(
        {"model": "m", "input": "x", "user": "u", "extra": [1]}
    )
    assert unused_locations(parsed) == ["extra", "user"]


def test_template_reads(llama_lm):
    class Tokenizer:
        chat_template = "{% for m in messages %}{{ m['name'] }}{{ m.tool_calls }}{% endfor %}"

    assert template_reads(Tokenizer()) == {"name", "tool_calls"}
    assert template_reads(llama_lm.tokenizer) == set()


def test_unused_template_kwargs_are_named_in_printable_ascii():
    # A key may hold anything (found by the fuzzer: a control character made the header fail to
    # serialise).
    unused = template_kwargs_unused(
        {"è\x10": 1, "enable_thinking": True}, frozenset({"enable_thinking"})
    )
    assert unused == ["chat_template_kwargs.%C3%A8%10"]
    assert string_list(unused, 1024) == '"chat_template_kwargs.%C3%A8%10"'
