"""POST /v1/chat/completions through the official OpenAI SDK and raw HTTP."""

import pytest

from tests.api.clients import MODEL, answer_events, post, sdk, sse_events

USER = [{"role": "user", "content": "What is the capital of France?"}]


def chat(server, **kwargs):
    return sdk(server).chat.completions.create(
        model=MODEL, **{"messages": USER, "temperature": 0, "max_tokens": 24, **kwargs}
    )


def test_response_shape_usage_and_fingerprint(llama_server, llama_lm):
    response = chat(llama_server)
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert response.model == MODEL
    choice = response.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    rendered = llama_lm.tokenizer.apply_chat_template(
        USER, add_generation_prompt=True, tokenize=False
    )
    prompt_tokens = len(llama_lm.tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert response.usage.prompt_tokens == prompt_tokens
    if choice.finish_reason == "length":
        assert response.usage.completion_tokens == 24
    assert response.usage.total_tokens == prompt_tokens + response.usage.completion_tokens
    assert response.system_fingerprint == "millm:tiny-llama@unrecorded:float32/FP32:transformers"


def test_rendered_prompt_has_one_bos(llama_server, llama_lm):
    # The template writes BOS itself; tokenising must not add a second one.
    response = chat(llama_server, max_tokens=1)
    rendered = llama_lm.tokenizer.apply_chat_template(
        USER, add_generation_prompt=True, tokenize=False
    )
    with_extra_bos = len(llama_lm.tokenizer(rendered, add_special_tokens=True)["input_ids"])
    assert response.usage.prompt_tokens == with_extra_bos - 1


def test_streaming_equals_non_streaming(llama_server):
    whole = chat(llama_server, max_tokens=40)
    chunks = list(chat(llama_server, max_tokens=40, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    said, last = chunks[-1], chunks[-2]  # the last chunk says what steered the stream
    assert said.choices == [] and said.model_extra["millm_steering"] == "none"
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-2])


def test_stream_frames_and_done(llama_server):
    response = post(
        llama_server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "max_tokens": 5, "stream": True, "temperature": 0},
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = answer_events(sse_events(response.text))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert (
        events[-2]["choices"][0]["finish_reason"] == "length"
        and events[-2]["usage"]["completion_tokens"] == 5
    )
    assert all(
        e["object"] == "chat.completion.chunk" and "system_fingerprint" not in e
        for e in events[:-1]
    )


def test_include_usage_sends_a_usage_only_chunk(llama_server):
    chunks = list(
        chat(llama_server, max_tokens=5, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-2].choices == [] and chunks[-2].usage.completion_tokens == 5
    assert chunks[-3].choices[0].finish_reason == "length" and chunks[-3].usage is None
    assert chunks[-1].choices == [] and chunks[-1].usage is None


def test_n_choices_are_seeded_per_choice(llama_server):
    many = chat(llama_server, n=3, temperature=1.0, seed=11, max_tokens=20)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert len({c.message.content for c in many.choices}) == 3
    one = chat(llama_server, n=1, temperature=1.0, seed=11, max_tokens=20)
    assert many.choices[0].message.content == one.choices[0].message.content
    assert many.usage.prompt_tokens == one.usage.prompt_tokens
    if all(c.finish_reason == "length" for c in many.choices):
        assert many.usage.completion_tokens == 3 * 20


@pytest.mark.parametrize("stream", [False, True])
def test_same_seed_same_body_is_byte_identical(llama_server, stream):
    body = {
        "model": MODEL,
        "messages": USER,
        "temperature": 1.0,
        "top_p": 0.95,
        "seed": 1234,
        "max_tokens": 40,
        "stream": stream,
    }
    first, second = (
        post(llama_server, "/v1/chat/completions", body),
        post(llama_server, "/v1/chat/completions", body),
    )
    assert first.headers["x-millm-seed"] == '1234;scope="request"'
    if stream:
        texts = [
            "".join(
                e["choices"][0]["delta"].get("content", "")
                for e in sse_events(r.text)[:-1]
                if e["choices"]
            )
            for r in (first, second)
        ]
        finishes = [
            answer_events(sse_events(r.text))[-2]["choices"][0]["finish_reason"]
            for r in (first, second)
        ]
    else:
        texts = [r.json()["choices"][0]["message"]["content"] for r in (first, second)]
        finishes = [r.json()["choices"][0]["finish_reason"] for r in (first, second)]
    assert texts[0] == texts[1] and texts[0]
    assert finishes[0] == finishes[1]
    other = post(
        llama_server, "/v1/chat/completions", {**body, "seed": 4321, "stream": False}
    ).json()
    assert other["choices"][0]["message"]["content"] != texts[0]


def test_no_seed_no_seed_header(llama_server):
    response = post(
        llama_server, "/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 2}
    )
    assert "x-millm-seed" not in response.headers


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_is_cut_and_never_sent(llama_server, stream):
    free = chat(llama_server, max_tokens=40).choices[0].message.content
    stop = free[12:15]
    cut = free.index(stop)
    if stream:
        chunks = list(chat(llama_server, max_tokens=40, stop=[stop, "never-there"], stream=True))
        deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        text, finish = "".join(deltas), chunks[-2].choices[0].finish_reason
    else:
        response = chat(llama_server, max_tokens=40, stop=stop)
        text, finish = response.choices[0].message.content, response.choices[0].finish_reason
    assert text == free[:cut]
    assert stop not in text
    assert finish == "stop"


def test_trailing_assistant_message_is_continued(llama_server, llama_lm):
    partial = "The capital of"
    messages = USER + [{"role": "assistant", "content": partial}]
    continued = chat(llama_server, messages=messages, max_tokens=15)
    head = llama_lm.tokenizer.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    verbatim = sdk(llama_server).completions.create(
        model=MODEL,
        prompt=head + partial,
        max_tokens=15,
        temperature=0,
        extra_body={"add_special_tokens": False},
    )
    assert continued.choices[0].message.content == verbatim.choices[0].text
    assert continued.usage.prompt_tokens == verbatim.usage.prompt_tokens


def test_a_lone_assistant_message_is_continued_after_the_templates_opening(llama_server, llama_lm):
    # Nothing precedes the partial: the template's own opening for that turn comes first.
    partial = "Once upon"
    continued = chat(
        llama_server, messages=[{"role": "assistant", "content": partial}], max_tokens=12
    )
    verbatim = sdk(llama_server).completions.create(
        model=MODEL,
        prompt="<s><|im_start|>assistant\n" + partial,
        max_tokens=12,
        temperature=0,
        extra_body={"add_special_tokens": False},
    )
    assert continued.choices[0].message.content == verbatim.choices[0].text
    assert continued.usage.prompt_tokens == verbatim.usage.prompt_tokens


def test_text_parts_and_developer_role(llama_server):
    as_parts = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Really."}],
        },
        *USER,
    ]
    as_string = [{"role": "system", "content": "Be brief.\nReally."}, *USER]
    assert (
        chat(llama_server, messages=as_parts).choices[0].message.content
        == chat(llama_server, messages=as_string).choices[0].message.content
    )


def test_tool_and_function_roles_render(llama_server):
    messages = USER + [
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "Paris", "tool_call_id": "call_1"},
        {"role": "function", "content": "Paris", "name": "lookup"},
        {"role": "user", "content": "So?"},
    ]
    assert chat(llama_server, messages=messages).choices[0].finish_reason in ("stop", "length")


def test_no_template_model_uses_the_generic_fallback(tiny_dirs, tmp_path):
    from tests.support.server import ServerProcess

    server = ServerProcess(tmp_path, ["--model", str(tiny_dirs["llama-plain"])]).wait_ready()
    try:
        response = sdk(server).chat.completions.create(
            model="tiny-llama-plain", messages=USER, max_tokens=3, temperature=0
        )
        # "<s>User: What is the capital of France?\n\nAssistant:" under the fallback template.
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tiny_dirs["llama-plain"]))
        expected = tok(
            "<s>User: What is the capital of France?\n\nAssistant:", add_special_tokens=False
        )["input_ids"]
        assert response.usage.prompt_tokens == len(expected)
    finally:
        server.stop()


def prompt_tokens_of(lm, **variables) -> int:
    rendered = lm.tokenizer.apply_chat_template(
        USER, add_generation_prompt=True, tokenize=False, **variables
    )
    return len(lm.tokenizer(rendered, add_special_tokens=False)["input_ids"])


def test_chat_template_kwargs_reach_the_template(llama_server, llama_lm):
    """The tiny template reads `enable_thinking` as Qwen 3's does (an empty thought block when
    false)."""
    off = post(
        llama_server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 1,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    on = post(
        llama_server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 1,
            "chat_template_kwargs": {"enable_thinking": True},
        },
    )
    assert off.status_code == on.status_code == 200
    assert off.json()["usage"]["prompt_tokens"] == prompt_tokens_of(llama_lm, enable_thinking=False)
    assert on.json()["usage"]["prompt_tokens"] == prompt_tokens_of(llama_lm)
    # the block is really there
    assert prompt_tokens_of(llama_lm, enable_thinking=False) > prompt_tokens_of(llama_lm)
    assert "x-millm-ignored-fields" not in off.headers


def test_chat_template_kwargs_the_template_does_not_read_are_reported(llama_server, llama_lm):
    response = post(
        llama_server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 1,
            "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"},
        },
    )
    assert response.status_code == 200
    assert response.headers["x-millm-ignored-fields"] == '"chat_template_kwargs.reasoning_effort"'
    assert response.json()["usage"]["prompt_tokens"] == prompt_tokens_of(
        llama_lm, enable_thinking=False
    )
    strict = post(
        llama_server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 1,
            "chat_template_kwargs": {"reasoning_effort": "low"},
        },
        headers={"X-miLLM-Strict": "true"},
    )
    assert (
        strict.status_code == 400
        and strict.json()["error"]["param"] == "chat_template_kwargs.reasoning_effort"
    )


@pytest.mark.parametrize("key", ["messages", "add_generation_prompt", "bos_token"])
def test_chat_template_kwargs_may_not_replace_what_millm_renders(llama_server, key):
    response = post(
        llama_server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": USER, "max_tokens": 1, "chat_template_kwargs": {key: []}},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == f"chat_template_kwargs.{key}" and key in error["message"]
