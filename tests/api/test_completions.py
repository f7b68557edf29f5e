"""POST /v1/completions: verbatim prompts, one choice per prompt, token-id prompts, streaming."""

import pytest

from tests.api.clients import MODEL, answer_events, post, sdk, sse_events


def complete(server, **kwargs):
    return sdk(server).completions.create(
        model=MODEL, **{"temperature": 0, "max_tokens": 16, **kwargs}
    )


def test_one_choice_per_prompt_each_as_if_alone(llama_server):
    prompts = ["The cat runs", "Paris is the capital", "A"]
    together = complete(llama_server, prompt=prompts)
    assert together.object == "text_completion" and together.id.startswith("cmpl-")
    assert [c.index for c in together.choices] == [0, 1, 2]
    for i, prompt in enumerate(prompts):
        alone = complete(llama_server, prompt=prompt)
        assert together.choices[i].text == alone.choices[0].text
    assert together.usage.prompt_tokens == sum(
        complete(llama_server, prompt=p).usage.prompt_tokens for p in prompts
    )
    assert together.system_fingerprint.startswith("millm:tiny-llama@")


def test_prompt_is_verbatim_with_bos(llama_server, llama_lm):
    response = complete(llama_server, prompt="The cat runs", max_tokens=1)
    assert response.usage.prompt_tokens == len(llama_lm.tokenizer("The cat runs")["input_ids"])
    without = complete(
        llama_server, prompt="The cat runs", max_tokens=1, extra_body={"add_special_tokens": False}
    )
    assert without.usage.prompt_tokens == response.usage.prompt_tokens - 1


def test_token_id_prompts_equal_text_prompts(llama_server, llama_lm):
    ids = llama_lm.tokenizer("The cat runs")["input_ids"]
    by_text = complete(llama_server, prompt="The cat runs")
    assert complete(llama_server, prompt=ids).choices[0].text == by_text.choices[0].text
    two = complete(llama_server, prompt=[ids, ids[:2]])
    assert len(two.choices) == 2 and two.choices[0].text == by_text.choices[0].text


def test_each_prompt_is_seeded_separately_and_n_above_one_is_refused(llama_server):
    response = complete(llama_server, prompt=["The cat", "A river"], temperature=1.0, seed=5)
    assert [c.index for c in response.choices] == [0, 1]
    for i, prompt in enumerate(["The cat", "A river"]):
        alone = complete(llama_server, prompt=prompt, temperature=1.0, seed=5)
        assert response.choices[i].text == alone.choices[0].text
    refused = post(llama_server, "/v1/completions", {"model": MODEL, "prompt": "x", "n": 2})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "field_not_honoured"
    assert refused.json()["error"]["param"] == "n"


def test_streamed_multi_prompt_completion(llama_server):
    response = post(
        llama_server,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": ["The cat", "A river"],
            "max_tokens": 6,
            "temperature": 0,
            "stream": True,
        },
    )
    events = answer_events(sse_events(response.text))
    texts = {0: "", 1: ""}
    finishes = {}
    for event in events[:-1]:
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
            if choice["finish_reason"]:
                finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "length", 1: "length"}
    assert events[-2]["usage"]["completion_tokens"] == 12
    whole = complete(llama_server, prompt=["The cat", "A river"], max_tokens=6)
    assert [texts[0], texts[1]] == [c.text for c in whole.choices]


@pytest.mark.parametrize("stream", [False, True])
def test_completion_seed_is_reproducible(llama_server, stream):
    body = {
        "model": MODEL,
        "prompt": "Every feature",
        "temperature": 1.0,
        "seed": 99,
        "max_tokens": 30,
        "stream": stream,
    }
    a, b = post(llama_server, "/v1/completions", body), post(llama_server, "/v1/completions", body)
    assert a.text.count("text") > 0
    if stream:
        strip = lambda r: [e["choices"] for e in sse_events(r.text)[:-1]]
        assert strip(a) == strip(b)
    else:
        assert a.json()["choices"] == b.json()["choices"]
    assert a.headers["x-millm-seed"] == '99;scope="request"'
