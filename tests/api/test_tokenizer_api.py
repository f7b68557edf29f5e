"""vLLM's tokenizer routes (beyond the spec, issue 34) on a live server: the ids equal the model's
own tokenizer's, detokenize inverts tokenize, and bad input is a 400 naming the field."""

import pytest

from tests.api.clients import MODEL, api, post

TEXT = "The capital of France is Paris."


def test_tokenize_gives_the_ids_a_completion_prompt_gets(llama_server, llama_lm):
    response = post(llama_server, "/tokenize", {"prompt": TEXT, "return_token_strs": True})
    assert response.status_code == 200, response.text
    body = response.json()
    ids = llama_lm.tokenizer(TEXT)["input_ids"]
    assert body["tokens"] == ids
    assert body["count"] == len(ids)
    assert body["max_model_len"] == llama_lm.context_length
    assert body["token_strs"] == llama_lm.tokenizer.convert_ids_to_tokens(ids)
    bare = post(llama_server, "/tokenize", {"prompt": TEXT, "add_special_tokens": False}).json()
    assert bare["tokens"] == llama_lm.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert "token_strs" not in bare


def test_detokenize_inverts_tokenize(llama_server):
    ids = post(llama_server, "/tokenize", {"prompt": TEXT, "add_special_tokens": False}).json()[
        "tokens"
    ]
    response = post(llama_server, "/detokenize", {"model": MODEL, "tokens": ids})
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": TEXT}


def test_tokenizer_info_names_the_special_tokens_and_template(llama_server, llama_lm):
    response = api(llama_server, "GET", "/tokenizer_info")
    assert response.status_code == 200, response.text
    info = response.json()
    assert info["model"] == MODEL
    assert info["eos_token"] == llama_lm.tokenizer.eos_token
    assert info["vocab_size"] == llama_lm.vocab_size
    assert info["model_max_length"] == llama_lm.context_length
    assert info["chat_template"] == llama_lm.tokenizer.chat_template


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, None),
        ("/tokenize", {}, 400, None),
        ("/tokenize", {"prompt": "x", "model": "no-such-model"}, 404, "model"),
    ],
)
def test_bad_input_is_refused_in_the_api_shape(llama_server, path, body, status, param):
    response = post(llama_server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param
