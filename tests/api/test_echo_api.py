"""echo on /v1/completions (beyond the spec, issue 34): the prompt's own tokens scored, in OpenAI's
legacy logprobs shape, against transformers' forward pass on the same weights."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.api.clients import MODEL, post

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def stock(tiny_dirs):
    return AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32).eval()


def every_position(stock, ids):
    """log-probabilities at every position, straight from transformers' forward pass."""
    with torch.inference_mode():
        return torch.log_softmax(stock(torch.tensor([ids])).logits[0].float(), -1)


def echo(server, **extra):
    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 1}
    response = post(server, "/v1/completions", {**body, **extra})
    assert response.status_code == 200, response.text
    return response


def test_the_prompt_tokens_and_the_next_are_scored_as_a_forward_pass_scores_them(
    llama_server, llama_lm, stock
):
    response = echo(llama_server, return_tokens_as_token_ids=True, temperature=0)
    assert response.headers["x-millm-steering"] == "none"
    body = response.json()
    logprobs = body["choices"][0]["logprobs"]
    ids = llama_lm.tokenizer(PROMPT)["input_ids"]
    expected = every_position(stock, ids)
    assert logprobs["tokens"][: len(ids)] == [f"token_id:{t}" for t in ids]
    assert len(logprobs["tokens"]) == len(ids) + 1  # the prompt, then the next token
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for position in range(1, len(ids)):
        assert logprobs["token_logprobs"][position] == pytest.approx(
            expected[position - 1, ids[position]].item(), abs=1e-4
        )
        best = int(expected[position - 1].argmax())
        ((key, value),) = logprobs["top_logprobs"][position].items()
        assert key == f"token_id:{best}"
        assert value == pytest.approx(expected[position - 1, best].item(), abs=1e-4)
    chosen = int(expected[-1].argmax())
    assert logprobs["tokens"][-1] == f"token_id:{chosen}"
    assert logprobs["token_logprobs"][-1] == pytest.approx(expected[-1, chosen].item(), abs=1e-4)
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 1


def test_max_tokens_zero_scores_the_prompt_alone_and_offsets_count_its_characters(
    llama_server, llama_lm
):
    body = echo(llama_server, max_tokens=0).json()
    choice = body["choices"][0]
    ids = llama_lm.tokenizer(PROMPT)["input_ids"]
    assert len(choice["logprobs"]["tokens"]) == len(ids)
    assert choice["text"] == PROMPT
    pieces = choice["logprobs"]["tokens"]
    offsets = choice["logprobs"]["text_offset"]
    assert offsets[0] == 0
    assert all(offsets[i + 1] - offsets[i] == len(pieces[i]) for i in range(len(ids) - 1))
    assert body["usage"]["completion_tokens"] == 0


def test_batched_token_id_prompts_are_each_scored_as_alone(llama_server, llama_lm, stock):
    first = llama_lm.tokenizer(PROMPT)["input_ids"]
    second = llama_lm.tokenizer("A short one")["input_ids"]
    choices = echo(llama_server, prompt=[first, second], return_tokens_as_token_ids=True).json()[
        "choices"
    ]
    assert [c["index"] for c in choices] == [0, 1]
    for choice, ids in zip(choices, [first, second], strict=True):
        expected = every_position(stock, ids)
        got = choice["logprobs"]["token_logprobs"][1 : len(ids)]
        wanted = [expected[p - 1, ids[p]].item() for p in range(1, len(ids))]
        assert got == pytest.approx(wanted, abs=1e-4)


def test_greedy_prompt_tokens_read_as_greedy_the_way_lm_eval_reads_them(llama_server, llama_lm):
    # lm-eval: a continuation is greedy when each token's log-probability is its top alternative's.
    ids = llama_lm.tokenizer(PROMPT)["input_ids"]
    greedy = list(ids[:2])
    for _ in range(3):  # extend the prompt by the model's own greedy choices
        logprobs = echo(llama_server, prompt=greedy, return_tokens_as_token_ids=True).json()[
            "choices"
        ][0]["logprobs"]
        greedy.append(int(logprobs["tokens"][-1].removeprefix("token_id:")))
    logprobs = echo(llama_server, prompt=greedy).json()["choices"][0]["logprobs"]
    for token, top in zip(
        logprobs["token_logprobs"][2:-1], logprobs["top_logprobs"][2:-1], strict=True
    ):
        assert token == max(top.values())


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"allowed_token_ids": [40, 41]}, "echo"),
        ({"echo": False, "max_tokens": 0}, "max_tokens"),  # max_tokens 0 is echo's alone
        ({"stream": True}, "stream"),
    ],
)
def test_refusals_name_the_field(llama_server, extra, param):
    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 1}
    response = post(llama_server, "/v1/completions", {**body, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_echo_on_chat_is_refused_naming_it(llama_server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "echo": True}
    response = post(llama_server, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("echo", "field_not_honoured")


def test_a_prompt_past_the_window_is_refused_and_one_filling_it_is_scored(llama_server, llama_lm):
    window = llama_lm.context_length
    filling = [5 + (i % 50) for i in range(window)]
    body = echo(llama_server, prompt=filling, max_tokens=0).json()
    assert len(body["choices"][0]["logprobs"]["token_logprobs"]) == window
    response = post(
        llama_server,
        "/v1/completions",
        {"model": MODEL, "prompt": [*filling, 5], "echo": True, "logprobs": 1, "max_tokens": 1},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")


def test_echo_without_logprobs_puts_the_prompt_before_the_text(llama_server):
    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "max_tokens": 4, "temperature": 0}
    echoed = post(llama_server, "/v1/completions", body).json()["choices"][0]
    plain = post(llama_server, "/v1/completions", {**body, "echo": False}).json()["choices"][0]
    assert echoed["text"] == PROMPT + plain["text"]
    assert echoed["logprobs"] is None
    nothing = post(llama_server, "/v1/completions", {**body, "max_tokens": 0}).json()
    assert nothing["choices"][0]["text"] == PROMPT
    assert nothing["usage"]["completion_tokens"] == 0
