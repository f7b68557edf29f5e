"""Scoring mode on /v1/completions and chat scoring on /v1/chat/completions, against a direct
forward pass."""

import math

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.api.clients import MODEL, post, sdk
from tests.support.server import ServerProcess
from tests.support.steering_header import member

PROMPT = "The capital of France is"
ALLOWED = [40, 41, 300, 301]


@pytest.fixture(scope="module")
def stock(tiny_dirs):
    return AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32).eval()


def direct(stock, ids, allowed=None, temperature=1.0):
    """log-probabilities straight from transformers' forward pass."""
    with torch.inference_mode():
        logits = stock(torch.tensor([ids])).logits[0, -1].float()
    if temperature:
        logits = logits / temperature
    if allowed is not None:
        return dict(zip(allowed, torch.log_softmax(logits[allowed], -1).tolist(), strict=True))
    return dict(enumerate(torch.log_softmax(logits, -1).tolist()))


def scoring_body(**extra):
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, **extra}


@pytest.mark.parametrize("temperature", [1.0, 0.0, 0.7])
def test_completion_scoring_numbers_over_the_allowed_set(
    llama_server, llama_lm, stock, temperature
):
    response = post(
        llama_server,
        "/v1/completions",
        scoring_body(
            logprobs=2,
            allowed_token_ids=ALLOWED,
            temperature=temperature,
            return_tokens_as_token_ids=True,
        ),
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-millm-steering"] == "none"
    choice = response.json()["choices"][0]
    ids = llama_lm.tokenizer(PROMPT)["input_ids"]
    expected = direct(stock, ids, ALLOWED, temperature)
    top = choice["logprobs"]["top_logprobs"][0]
    assert set(top) == {f"token_id:{t}" for t in ALLOWED}  # every listed token is returned
    for token_id, logprob in expected.items():
        assert top[f"token_id:{token_id}"] == pytest.approx(logprob, abs=1e-4)
    best = max(expected, key=expected.get)
    assert choice["logprobs"]["tokens"] == [f"token_id:{best}"]
    assert choice["logprobs"]["token_logprobs"][0] == pytest.approx(expected[best], abs=1e-4)
    assert choice["text"] == llama_lm.tokenizer.decode([best])
    assert choice["logprobs"]["text_offset"] == [len(PROMPT)]
    assert choice["finish_reason"] == "length"
    assert math.fsum(math.exp(v) for v in top.values()) == pytest.approx(1.0, abs=1e-5)
    usage = response.json()["usage"]
    # Scoring never reads the prefix cache: its numbers are those of a whole forward pass.
    assert usage == {
        "prompt_tokens": len(ids),
        "completion_tokens": 1,
        "total_tokens": len(ids) + 1,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_unrestricted_top_logprobs_keyed_by_text(llama_server, llama_lm, stock):
    choice = post(llama_server, "/v1/completions", scoring_body(logprobs=3)).json()["choices"][0]
    expected = direct(stock, llama_lm.tokenizer(PROMPT)["input_ids"])
    top3 = sorted(expected, key=expected.get, reverse=True)[:3]
    texts = {llama_lm.tokenizer.decode([t]) for t in top3}
    assert set(choice["logprobs"]["top_logprobs"][0]) == texts
    assert choice["logprobs"]["token_logprobs"][0] == pytest.approx(expected[top3[0]], abs=1e-4)


def test_allowed_without_logprobs_constrains_and_returns_null(llama_server, llama_lm, stock):
    choice = post(llama_server, "/v1/completions", scoring_body(allowed_token_ids=ALLOWED)).json()[
        "choices"
    ][0]
    expected = direct(stock, llama_lm.tokenizer(PROMPT)["input_ids"], ALLOWED)
    assert choice["logprobs"] is None and choice["text"] == llama_lm.tokenizer.decode(
        [max(expected, key=expected.get)]
    )


def test_several_prompts_one_pass_each(llama_server, llama_lm, stock):
    prompts = [PROMPT, "A river", "Hello"]
    choices = post(
        llama_server,
        "/v1/completions",
        scoring_body(
            prompt=prompts, logprobs=0, allowed_token_ids=ALLOWED, return_tokens_as_token_ids=True
        ),
    ).json()["choices"]
    for i, prompt in enumerate(prompts):
        expected = direct(stock, llama_lm.tokenizer(prompt)["input_ids"], ALLOWED)
        assert choices[i]["index"] == i
        assert choices[i]["logprobs"]["token_logprobs"][0] == pytest.approx(
            max(expected.values()), abs=1e-4
        )


def test_add_special_tokens_false_scores_the_prompt_as_written(llama_server, llama_lm, stock):
    choice = post(
        llama_server, "/v1/completions", scoring_body(logprobs=1, add_special_tokens=False)
    ).json()["choices"][0]
    ids = llama_lm.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    expected = direct(stock, ids)
    assert choice["logprobs"]["token_logprobs"][0] == pytest.approx(
        max(expected.values()), abs=1e-4
    )


@pytest.mark.parametrize(
    "extra, param, code",
    [
        # allowed_token_ids is scoring's alone: a longer budget is refused. (logprobs with a longer
        # budget generate, reporting each token's: tests/api/test_generation_logprobs.py.)
        ({"max_tokens": 5, "allowed_token_ids": [40]}, "max_tokens", "invalid_parameter"),
        ({"max_tokens": None, "allowed_token_ids": [40]}, "max_tokens", "invalid_parameter"),
        ({"n": 2}, "n", "field_not_honoured"),
        ({"stream": True}, "stream", "invalid_parameter"),
        ({"temperature": 0.0005}, "temperature", "invalid_parameter"),
        ({"allowed_token_ids": [1, 10**6]}, "allowed_token_ids", "invalid_scoring_request"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "invalid_parameter"),
        ({"prompt": "", "add_special_tokens": False}, "prompt", "invalid_scoring_request"),
        ({"logprobs": 21}, "logprobs", "invalid_parameter"),
        ({"logprobs": True}, "logprobs", "invalid_parameter"),
        ({"top_logprobs": 2}, "top_logprobs", "field_not_honoured"),
        ({"profile": "p"}, "profile", "field_not_honoured"),
        ({"steering_intensity": 1}, "steering_intensity", "field_not_honoured"),
        ({"response_format": {"type": "json_object"}}, "response_format", "field_not_honoured"),
    ],
)
def test_scoring_refusals(llama_server, extra, param, code):
    body = {k: v for k, v in {**scoring_body(logprobs=2), **extra}.items() if v is not None}
    response = post(llama_server, "/v1/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)


def test_max_completion_tokens_one_also_selects_scoring(llama_server):
    body = {"model": MODEL, "prompt": PROMPT, "max_completion_tokens": 1, "logprobs": 1}
    assert post(llama_server, "/v1/completions", body).json()["choices"][0]["logprobs"] is not None


CHAT = [{"role": "user", "content": "Is Paris in France?"}]


def chat_score(server, **extra):
    return post(
        server, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 1, **extra}
    )


def test_chat_scoring_equals_completion_scoring_of_the_rendered_prompt(llama_server, llama_lm):
    rendered = llama_lm.tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=False
    )
    chat = chat_score(
        llama_server,
        logprobs=True,
        top_logprobs=4,
        allowed_token_ids=ALLOWED,
        return_tokens_as_token_ids=True,
    ).json()
    completion = post(
        llama_server,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": rendered,
            "max_tokens": 1,
            "logprobs": 4,
            "allowed_token_ids": ALLOWED,
            "add_special_tokens": False,
            "return_tokens_as_token_ids": True,
        },
    ).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 1
    completion_top = completion["choices"][0]["logprobs"]["top_logprobs"][0]
    assert {e["token"]: e["logprob"] for e in content[0]["top_logprobs"]} == completion_top
    assert content[0]["logprob"] == completion["choices"][0]["logprobs"]["token_logprobs"][0]
    assert chat["usage"]["prompt_tokens"] == completion["usage"]["prompt_tokens"]
    assert chat["choices"][0]["finish_reason"] == "length"
    for entry in content[0]["top_logprobs"]:
        token_id = int(entry["token"].split(":")[1])
        assert entry["bytes"] == list(llama_lm.tokenizer.decode([token_id]).encode("utf-8"))


@pytest.mark.parametrize("top, expected", [(None, 0), (0, 0), (2, 2), (20, 4)])
def test_chat_top_logprobs_count(llama_server, top, expected):
    extra = {"logprobs": True, "allowed_token_ids": ALLOWED}
    if top is not None:
        extra["top_logprobs"] = top
    content = chat_score(llama_server, **extra).json()["choices"][0]["logprobs"]["content"][0]
    assert len(content["top_logprobs"]) == expected


def test_chat_scoring_with_the_sdk(llama_server):
    response = sdk(llama_server).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=1, logprobs=True, top_logprobs=3
    )
    assert len(response.choices[0].logprobs.content[0].top_logprobs) == 3


def test_chat_allowed_without_logprobs_is_constrained(llama_server):
    choice = chat_score(llama_server, allowed_token_ids=ALLOWED).json()["choices"][0]
    assert choice["logprobs"] is None and choice["message"]["content"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "stream": True}, "stream"),
        ({"allowed_token_ids": [40], "max_tokens": 3}, "max_tokens"),
        ({"logprobs": True, "profile": "x"}, "profile"),
        ({"logprobs": True, "n": 2}, "n"),
    ],
)
def test_chat_scoring_refusals(llama_server, extra, param):
    response = chat_score(llama_server, **extra)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_extra_messages_are_scored_one_at_a_time_in_order(llama_server, llama_lm, stock):
    extras = [
        [{"role": "user", "content": "Is Rome in Italy?"}],
        [{"role": "user", "content": "Hello"}],
    ]
    choices = chat_score(
        llama_server, logprobs=True, allowed_token_ids=ALLOWED, extra_messages=extras
    ).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for choice, conversation in zip(choices, [CHAT, *extras], strict=True):
        ids = llama_lm.tokenizer(
            llama_lm.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"]
        expected = direct(stock, ids, ALLOWED)
        assert choice["logprobs"]["content"][0]["logprob"] == pytest.approx(
            max(expected.values()), abs=1e-4
        )


def test_scoring_is_never_steered(llama_server, tmp_path):
    from tests.support.tiny_saes import build_saelens

    sae = httpx.post(
        f"{llama_server.base_url}/api/saes",
        json={"path": str(build_saelens(tmp_path / "sae", layer=1))},
    ).json()["id"]
    before = post(llama_server, "/v1/completions", scoring_body(logprobs=5)).json()["choices"][0][
        "logprobs"
    ]
    httpx.post(f"{llama_server.base_url}/api/saes/{sae}/attach")
    httpx.put(f"{llama_server.base_url}/api/steering/saes/{sae}/features/0", json={"strength": 150})
    try:
        steered_generation = post(
            llama_server,
            "/v1/completions",
            {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "temperature": 0},
        )
        assert member(steered_generation.headers["x-millm-steering"])[0] == "manual"
        after = post(llama_server, "/v1/completions", scoring_body(logprobs=5))
        assert after.headers["x-millm-steering"] == "none"
        assert after.json()["choices"][0]["logprobs"] == before
    finally:
        httpx.delete(f"{llama_server.base_url}/api/steering/features")
        httpx.post(f"{llama_server.base_url}/api/saes/{sae}/detach")


def test_no_chat_template_refuses_chat_scoring(tiny_dirs, tmp_path):
    server = ServerProcess(tmp_path, ["--model", str(tiny_dirs["llama-plain"])]).wait_ready()
    try:
        response = post(
            server,
            "/v1/chat/completions",
            {"model": "tiny-llama-plain", "messages": CHAT, "max_tokens": 1, "logprobs": True},
        )
        assert (
            response.status_code == 400 and response.json()["error"]["code"] == "no_chat_template"
        )
        generated = post(
            server,
            "/v1/chat/completions",
            {"model": "tiny-llama-plain", "messages": CHAT, "max_tokens": 2},
        )
        assert generated.status_code == 200  # generation keeps its generic fallback
    finally:
        server.stop()


def test_nan_logits_are_a_500_only_where_they_reach_the_answer(tiny_dirs, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight[5] = float("nan")
    directory = tmp_path / "nan-llama"
    model.save_pretrained(str(directory))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).write_bytes((tiny_dirs["llama"] / name).read_bytes())
    server = ServerProcess(tmp_path / "home", ["--model", str(directory)]).wait_ready()
    try:
        bad = post(
            server,
            "/v1/completions",
            {
                "model": "nan-llama",
                "prompt": PROMPT,
                "max_tokens": 1,
                "logprobs": 1,
                "allowed_token_ids": [5, 6],
            },
        )
        assert bad.status_code == 500 and bad.json()["error"]["code"] == "non_finite_logits"
        unrestricted = post(
            server,
            "/v1/completions",
            {"model": "nan-llama", "prompt": PROMPT, "max_tokens": 1, "logprobs": 1},
        )
        assert unrestricted.status_code == 500
        fine = post(
            server,
            "/v1/completions",
            {
                "model": "nan-llama",
                "prompt": PROMPT,
                "max_tokens": 1,
                "logprobs": 1,
                "allowed_token_ids": [6, 7],
            },
        )
        assert fine.status_code == 200
    finally:
        server.stop()
