"""Logprobs while generating (beyond the spec, issue 34): chat `logprobs: true` + `top_logprobs`
and completions `logprobs: k` with a budget above one token return each generated token's
log-probability in OpenAI's shapes, streamed too, from the distribution it was drawn from; held
here against transformers' forward pass over the prompt and the tokens drawn so far."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.api.clients import MODEL, post, sse_events

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name a city."}]
BUDGET = 6


@pytest.fixture(scope="module")
def stock(tiny_dirs):
    return AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32).eval()


def forward(stock, ids):
    """log-probabilities at every position of `ids`, unscaled."""
    with torch.inference_mode():
        return torch.log_softmax(stock(torch.tensor([ids])).logits[0].float(), -1)


def chat_prompt(lm) -> list[int]:
    """The chat's prompt ids as the server renders them (template, then no special tokens again)."""
    rendered = lm.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    return lm.tokenizer(rendered, add_special_tokens=False)["input_ids"]


def drawn_ids(entries) -> list[int]:
    return [int(e["token"].removeprefix("token_id:")) for e in entries]


def test_chat_reports_each_drawn_tokens_logprob_as_a_forward_pass_gives_it(
    llama_server, llama_lm, stock
):
    body = {
        "model": MODEL,
        "messages": CHAT,
        "max_tokens": BUDGET,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    response = post(llama_server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert response.headers["x-millm-steering"] == "none"
    answer = response.json()
    entries = answer["choices"][0]["logprobs"]["content"]
    drawn = drawn_ids(entries)
    prompt = chat_prompt(llama_lm)
    expected = forward(stock, [*prompt, *drawn])
    for step, (entry, token) in enumerate(zip(entries, drawn, strict=True)):
        row = expected[len(prompt) - 1 + step]
        assert entry["logprob"] == pytest.approx(row[token].item(), abs=1e-4)
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the best one
        assert entry["top_logprobs"][1]["logprob"] == pytest.approx(
            row.topk(2).values[1].item(), abs=1e-4
        )
    eos = answer["choices"][0]["finish_reason"] == "stop"  # EOS is counted, never reported
    assert len(entries) == answer["usage"]["completion_tokens"] - eos


def test_completions_legacy_logprobs_count_offsets_from_the_prompt(llama_server, llama_lm, stock):
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": BUDGET,
        "temperature": 0,
        "logprobs": 1,
    }
    choice = post(llama_server, "/v1/completions", body).json()["choices"][0]
    legacy = choice["logprobs"]
    ids = llama_lm.tokenizer(PROMPT)["input_ids"]
    assert len(legacy["tokens"]) == len(legacy["token_logprobs"]) == len(legacy["text_offset"])
    assert legacy["text_offset"][0] == len(PROMPT)
    for i in range(len(legacy["tokens"]) - 1):
        assert legacy["text_offset"][i + 1] - legacy["text_offset"][i] == len(legacy["tokens"][i])
    assert "".join(legacy["tokens"]).startswith(choice["text"][: len(legacy["tokens"][0])])
    by_id = post(llama_server, "/v1/completions", {**body, "return_tokens_as_token_ids": True})
    drawn = [
        int(t.removeprefix("token_id:")) for t in by_id.json()["choices"][0]["logprobs"]["tokens"]
    ]
    expected = forward(stock, [*ids, *drawn])
    for step, (token, logprob) in enumerate(zip(drawn, legacy["token_logprobs"], strict=True)):
        assert logprob == pytest.approx(expected[len(ids) - 1 + step, token].item(), abs=1e-4)
        assert max(legacy["top_logprobs"][step].values()) == pytest.approx(logprob, abs=1e-6)


def test_a_sampled_tokens_logprob_is_of_the_tempered_distribution(llama_server, llama_lm, stock):
    body = {
        "model": MODEL,
        "messages": CHAT,
        "max_tokens": 3,
        "temperature": 0.7,
        "seed": 7,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
    }
    entries = post(llama_server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"][
        "content"
    ]
    drawn = drawn_ids(entries)
    prompt = chat_prompt(llama_lm)
    with torch.inference_mode():
        logits = stock(torch.tensor([[*prompt, *drawn]])).logits[0].float()
    tempered = torch.log_softmax(logits / 0.7, -1)
    for step, (entry, token) in enumerate(zip(entries, drawn, strict=True)):
        assert entry["logprob"] == pytest.approx(
            tempered[len(prompt) - 1 + step, token].item(), abs=1e-4
        )
        assert entry["top_logprobs"] == []  # top_logprobs absent: none


def test_streamed_logprobs_add_up_to_the_whole_answers(llama_server):
    body = {
        "model": MODEL,
        "messages": CHAT,
        "max_tokens": BUDGET,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 1,
    }
    whole = post(llama_server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]
    streamed = post(llama_server, "/v1/chat/completions", {**body, "stream": True})
    pieces = []
    for event in sse_events(streamed.text):
        if event == "[DONE]" or not event["choices"]:
            continue
        logprobs = event["choices"][0].get("logprobs")
        if logprobs is not None:
            pieces += logprobs["content"]
    assert pieces == whole["content"]


def test_echo_while_generating_puts_the_scored_prompt_first(llama_server, llama_lm):
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 1,
        "echo": True,
    }
    echoed = post(llama_server, "/v1/completions", body).json()["choices"][0]
    plain = post(llama_server, "/v1/completions", {**body, "echo": False}).json()["choices"][0]
    ids = llama_lm.tokenizer(PROMPT)["input_ids"]
    assert echoed["text"] == PROMPT + plain["text"]
    legacy = echoed["logprobs"]
    assert legacy["token_logprobs"][0] is None
    assert legacy["token_logprobs"][len(ids) :] == plain["logprobs"]["token_logprobs"]
    assert legacy["text_offset"][len(ids) :] == plain["logprobs"]["text_offset"]
    streamed = post(llama_server, "/v1/completions", {**body, "stream": True})
    events = [e for e in sse_events(streamed.text) if e != "[DONE]" and e["choices"]]
    assert events[0]["choices"][0]["text"] == PROMPT
    assert "".join(e["choices"][0]["text"] for e in events) == echoed["text"]
