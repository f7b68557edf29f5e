"""The logit lens (issue 35): each block's residual through the model's own final norm and head,
held against transformers' hidden states on the same weights (Llama, and Gemma 2 with its final
soft-cap), its last block against the model's own scoring, and steering changing only the blocks
at and after the steered one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.api.clients import MODEL, api, llama_with_sae, post
from tests.support.server import ServerProcess

TEXT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    with llama_with_sae(tiny_dirs, tmp_path_factory.mktemp("lens"), seed=5) as process:
        yield process


def lens(server, **body) -> dict:
    answer = post(server, "/api/lens", {"text": TEXT, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


def reference(model_dir, ids: list[int]) -> list[torch.Tensor]:
    """Per block: softmax(head(final_norm(block output))) at every position, from transformers."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        # after each block; the last is already final-normed by transformers
        states = out.hidden_states[1:]
        probs = []
        for i, hidden in enumerate(states):
            normed = hidden[0] if i == len(states) - 1 else model.model.norm(hidden[0])
            logits = model.lm_head(normed).float()
            cap = getattr(model.config, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
            probs.append(torch.softmax(logits, -1))
    return probs


def test_each_block_reads_as_transformers_hidden_states_say(server, tiny_dirs):
    body = lens(server, top_k=3)
    ids = [t["token_id"] for t in body["tokens"]]
    expected = reference(tiny_dirs["llama"], ids)
    assert body["layers"] == list(range(len(expected))) and body["steered"] is False
    for prediction in body["predictions"]:
        p = prediction["position"]
        final = int(expected[-1][p].argmax())
        assert prediction["final"]["token_id"] == final
        assert prediction["final"]["probability"] == pytest.approx(
            expected[-1][p, final].item(), abs=1e-4
        )
        for cell in prediction["layers"]:
            probs = expected[cell["layer"]][p]
            top = probs.topk(3)
            assert [t["token_id"] for t in cell["top"]] == top.indices.tolist()
            assert [t["probability"] for t in cell["top"]] == pytest.approx(
                top.values.tolist(), abs=1e-4
            )
            assert cell["final_probability"] == pytest.approx(probs[final].item(), abs=1e-4)


def test_the_last_block_is_the_models_own_next_token(server):
    body = lens(server, positions="last", layers=[2])
    (last,) = body["predictions"]
    assert last["position"] == len(body["tokens"]) - 1 and [c["layer"] for c in last["layers"]] == [
        2
    ]
    scored = post(
        server,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": TEXT,
            "max_tokens": 1,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        },
    ).json()["choices"][0]["logprobs"]
    assert scored["tokens"][0] == f"token_id:{last['final']['token_id']}"
    assert last["layers"][0]["final_probability"] == pytest.approx(
        torch.tensor(scored["token_logprobs"][0]).exp().item(), abs=1e-4
    )


def test_gemma2_with_its_final_softcap(tiny_dirs, tmp_path):
    process = ServerProcess(tmp_path, ["--model", str(tiny_dirs["gemma2"])])
    try:
        process.wait_ready()
        body = lens(process, layers=[0, 1])
    finally:
        process.stop()
    ids = [t["token_id"] for t in body["tokens"]]
    expected = reference(tiny_dirs["gemma2"], ids)
    for prediction in body["predictions"]:
        for cell in prediction["layers"]:
            probs = expected[cell["layer"]][prediction["position"]]
            assert cell["top"][0]["token_id"] == int(probs.argmax())
            assert cell["top"][0]["probability"] == pytest.approx(probs.max().item(), abs=1e-4)


def test_steering_changes_the_blocks_from_the_steered_one_on(server):
    plain = lens(server)
    steered = lens(
        server, steering={"features": [{"sae_id": server.sae, "index": 3, "strength": 60.0}]}
    )
    assert steered["steered"] is True and steered["steering"]["kind"] == "features"
    for before, after in zip(plain["predictions"], steered["predictions"], strict=True):
        # Block 0 runs before the steering after block 1: the same reading (its probability of the
        # final prediction moves only because the steered model's final prediction may differ).
        assert before["layers"][0]["top"] == after["layers"][0]["top"]
        assert before["layers"][1]["top"] != after["layers"][1]["top"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text": TEXT, "layers": [7]}, "layers[0]"),
        ({"text": TEXT, "top_k": 11}, "top_k"),
        ({"text": TEXT, "messages": [{"role": "user", "content": "x"}]}, None),
        ({"text": TEXT, "positions": "some"}, "positions"),
        (
            {"text": TEXT, "steering": {"features": [{"index": 1, "strength": 1.0}]}},
            "steering.features[0].sae_id",
        ),
        ({"text": TEXT, "model": "nope"}, "model"),
    ],
)
def test_bad_lens_requests_name_the_field(server, body, param):
    refused = post(server, "/api/lens", body)
    assert refused.status_code in (400, 404), refused.text
    assert refused.json()["error"]["param"] == param


def test_the_api_key_opens_the_lens(tiny_dirs, tmp_path):
    process = ServerProcess(
        tmp_path,
        ["--model", str(tiny_dirs["llama"])],
        env={"MILLM_API_KEY": "k1", "MILLM_ADMIN_KEY": "k2"},
    )
    try:
        process.wait_ready()
        assert api(process, "POST", "/api/lens", json={"text": TEXT}).status_code == 401
        keyed = api(
            process,
            "POST",
            "/api/lens",
            json={"text": TEXT},
            headers={"Authorization": "Bearer k1"},
        )
        assert keyed.status_code == 200, keyed.text
    finally:
        process.stop()
