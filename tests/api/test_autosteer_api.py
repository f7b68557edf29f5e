"""AutoSteer on a live server (tiny Llama, a tiny SAE with labels): the job's candidates, sweep,
judge and fluency numbers equal what the server's own routes and a stock forward pass give."""

from __future__ import annotations

import math

import pytest
import torch

from millm.engine.prompts import chat_prompt_ids
from millm.lab.discovery.judge import QUESTION, judge_tokens
from tests.api.clients import MODEL, api, error, finished_job, llama_with_sae, post

PROBES = ["Tell me about rivers.", "Hello there"]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    with llama_with_sae(tiny_dirs, tmp_path_factory.mktemp("autosteer"), seed=7) as process:
        process.sae_id = process.sae
        yield process


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dirs["tokenizer"]))


@pytest.fixture(scope="module")
def result(server):
    body = {
        "goal": "paris",
        "probe_prompts": PROBES,
        "candidates": 2,
        "strengths": [3.0, 9.0],
        "max_tokens": 6,
        "save_as": "auto-paris",
        "rank_by": "judge",
    }
    response = post(server, "/api/autosteer", body)
    assert response.status_code == 202, response.text
    job = finished_job(server, response.json()["id"])
    assert job["state"] == "succeeded", job
    assert job["progress"] == {"done": 4, "total": 4, "unit": "settings"}
    return job["result"]


def p_yes(server, tokenizer, goal: str, text: str) -> float:
    yes, no = judge_tokens(tokenizer)
    messages = [{"role": "user", "content": QUESTION.format(text=text.strip(), goal=goal)}]
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": len(yes + no),
        "allowed_token_ids": list(yes + no),
        "return_tokens_as_token_ids": True,
    }
    content = post(server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"][
        "content"
    ][0]
    return sum(
        math.exp(e["logprob"])
        for e in content["top_logprobs"]
        if int(e["token"].split(":")[1]) in yes
    )


def token_logprobs(
    tiny_dirs, tokenizer, texts: list[str], system: str | None = None
) -> list[float]:
    """Each answer token's log-probability after its probe (and `system`), from a stock forward
    pass."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    values = []
    for probe, text in zip(PROBES, texts, strict=True):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": probe}
        ]
        prompt = chat_prompt_ids(tokenizer, messages)
        sequence = prompt + tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(torch.tensor([sequence])).logits[0].float(), dim=-1)
        values += [float(logprobs[t - 1, sequence[t]]) for t in range(len(prompt), len(sequence))]
    return values


def fluency(tiny_dirs, tokenizer, texts: list[str]) -> float:
    values = token_logprobs(tiny_dirs, tokenizer, texts)
    return sum(values) / len(values)


def affinity(tiny_dirs, tokenizer, texts: list[str], goal: str) -> float:
    primed = token_logprobs(tiny_dirs, tokenizer, texts, f"You {goal}.")
    control = token_logprobs(tiny_dirs, tokenizer, texts, "You are a helpful assistant.")
    return sum(p - c for p, c in zip(primed, control, strict=True)) / len(primed)


def test_candidates_come_from_the_label_search(server, result):
    hits = api(
        server, "GET", f"/api/saes/{server.sae_id}/features", params={"q": "paris", "limit": 2}
    ).json()["data"]
    assert [c["index"] for c in result["candidates"]] == [h["index"] for h in hits]
    assert all(c["source"] == "labels" and c["index"] % 10 == 0 for c in result["candidates"])
    # unit-norm decoder rows
    assert all(c["decoder_norm"] == pytest.approx(1.0, abs=1e-4) for c in result["candidates"])


def test_the_sweep_is_every_candidate_at_every_strength_ranked(result):
    settings = result["settings"]
    assert sorted((s["index"], s["strength"]) for s in settings) == sorted(
        (c["index"], s) for c in result["candidates"] for s in (3.0, 9.0)
    )
    keys = [(not s["fluent"], -s["concept"], -s["fluency"]) for s in settings]
    assert keys == sorted(keys)
    for s in settings:
        assert 0.0 <= s["concept"] <= 1.0 and len(s["samples"]) == len(PROBES)
        assert s["lift"] == pytest.approx(s["concept"] - result["baseline"]["concept"], abs=2e-4)
        assert s["fluent"] == (s["fluency"] >= result["baseline"]["fluency"] - 1.0)


def test_the_judge_is_the_unsteered_scoring_path(server, tokenizer, result):
    baseline = result["baseline"]
    expected = sum(p_yes(server, tokenizer, "paris", text) for text in baseline["samples"]) / len(
        PROBES
    )
    assert baseline["concept"] == pytest.approx(expected, abs=1e-3)
    setting = result["settings"][0]
    expected = sum(p_yes(server, tokenizer, "paris", text) for text in setting["samples"]) / len(
        PROBES
    )
    assert setting["concept"] == pytest.approx(expected, abs=1e-3)


def test_fluency_is_the_unsteered_log_likelihood_per_token(tiny_dirs, tokenizer, result):
    assert result["baseline"]["fluency"] == pytest.approx(
        fluency(tiny_dirs, tokenizer, result["baseline"]["samples"]), abs=1e-3
    )
    setting = result["settings"][-1]
    assert setting["fluency"] == pytest.approx(
        fluency(tiny_dirs, tokenizer, setting["samples"]), abs=1e-3
    )


def test_affinity_is_the_log_likelihood_gain_of_being_told_the_goal(tiny_dirs, tokenizer, result):
    assert (
        result["goal_system"] == "You paris."
        and result["control_system"] == "You are a helpful assistant."
    )
    assert result["baseline"]["affinity"] == pytest.approx(
        affinity(tiny_dirs, tokenizer, result["baseline"]["samples"], "paris"), abs=1e-3
    )
    setting = result["settings"][1]
    assert setting["affinity"] == pytest.approx(
        affinity(tiny_dirs, tokenizer, setting["samples"], "paris"), abs=1e-3
    )
    assert setting["affinity_lift"] == pytest.approx(
        setting["affinity"] - result["baseline"]["affinity"], abs=2e-4
    )


def test_rank_by_affinity_orders_the_fluent_settings_by_it(server):
    body = {
        "goal": "talk about paris",
        "probe_prompts": PROBES,
        "candidates": 2,
        "strengths": [3.0, 9.0],
        "max_tokens": 6,
    }
    job = finished_job(server, post(server, "/api/autosteer", body).json()["id"])
    assert job["state"] == "succeeded", job
    got = job["result"]
    keys = [(not s["fluent"], -s["affinity_lift"], -s["fluency"]) for s in got["settings"]]
    assert got["rank_by"] == "affinity" and keys == sorted(keys)  # the default
    hits = api(
        server, "GET", f"/api/saes/{server.sae_id}/features", params={"q": "paris", "limit": 2}
    ).json()["data"]
    # "talk about" is left out of the search
    assert [c["index"] for c in got["candidates"]] == [h["index"] for h in hits]
    best = got["best"]
    assert best is None or (
        best["fluent"] and best["affinity_lift"] > 0 and best == got["settings"][0]
    )


def test_samples_are_what_a_request_steered_the_same_way_answers(server, result):
    setting = result["settings"][0]
    profile = {
        "name": "same-as-setting",
        "steering": [
            {
                "sae_id": server.sae_id,
                "features": [{"index": setting["index"], "strength": setting["strength"]}],
            }
        ],
    }
    assert post(server, "/api/profiles", profile).status_code in (200, 201)
    for probe, sample in zip(PROBES, setting["samples"], strict=True):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": probe}],
            "max_tokens": 6,
            "temperature": 0,
            "profile": "same-as-setting",
        }
        assert (
            post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
            == sample
        )


def test_the_best_setting_is_saved_as_a_profile_only_when_it_beats_the_baseline(server, result):
    best = result["best"]
    if best is None:
        assert result["saved_profile"] is None and "no fluent setting" in result["note"]
        assert api(server, "GET", "/api/profiles/auto-paris").status_code == 404
        return
    assert best["fluent"] and best["lift"] > 0
    saved = api(server, "GET", f"/api/profiles/{result['saved_profile']['id']}").json()
    assert saved["name"] == "auto-paris"
    feature = saved["document"]["steering"][0]["features"][0]
    assert (feature["index"], feature["strength"]) == (best["index"], best["strength"])


def test_default_strengths_follow_the_residual_norm_and_included_features_are_tried(server, result):
    body = {
        "goal": "paris",
        "probe_prompts": PROBES[:1],
        "candidates": 1,
        "include": [7],
        "strength_fractions": [0.25],
        "max_tokens": 2,
    }
    job = finished_job(server, post(server, "/api/autosteer", body).json()["id"])
    assert job["state"] == "succeeded", job
    got = job["result"]
    assert [(c["index"], c["source"], c["evidence"]) for c in got["candidates"]][1:] == [
        (7, "given", None)
    ]
    norms = {c["index"]: c["decoder_norm"] for c in got["candidates"]}
    for setting in got["settings"]:
        assert setting["strength"] == pytest.approx(
            round(0.25 * got["residual_norm"] / norms[setting["index"]], 2), abs=0.011
        )
    assert len(got["settings"]) == 2


def test_examples_add_contrast_candidates(server):
    body = {
        "goal": "zzz",
        "examples": ["paris paris river", "the river by paris"],
        "neutral": ["hello there friend", "a cat sat down"],
        "probe_prompts": PROBES[:1],
        "candidates": 2,
        "strengths": [2.0],
        "max_tokens": 2,
    }
    job = finished_job(server, post(server, "/api/autosteer", body).json()["id"])
    assert job["state"] == "succeeded", job
    contrast = post(
        server,
        f"/api/saes/{server.sae_id}/contrast",
        {
            "a": {"texts": body["examples"]},
            "b": {"texts": body["neutral"]},
            "top_k": 2,
            "aggregate": "mean",
        },
    ).json()
    expected = [f["index"] for f in contrast["favouring_a"] if f["difference"] > 0][:2]
    assert [
        c["index"] for c in job["result"]["candidates"] if c["source"] == "contrast"
    ] == expected


def test_a_job_can_be_cancelled(server):
    body = {
        "goal": "paris",
        "probe_prompts": PROBES,
        "candidates": 4,
        "strengths": [1.0, 2.0, 3.0, 4.0],
        "max_tokens": 24,
    }
    job_id = post(server, "/api/autosteer", body).json()["id"]
    cancelled = api(server, "DELETE", f"/api/jobs/{job_id}")
    assert cancelled.status_code == 200
    assert finished_job(server, job_id)["state"] == "cancelled"


@pytest.mark.parametrize(
    "body, status, code, param",
    [
        ({"goal": ""}, 400, None, "goal"),
        ({"goal": "x", "strengths": [1.0], "strength_fractions": [0.1]}, 400, None, None),
        ({"goal": "x", "strengths": [500.0]}, 400, None, "strengths[0]"),
        ({"goal": "x", "neutral": ["a b c"]}, 400, None, None),
        ({"goal": "x", "candidates": 0}, 400, None, "candidates"),
        ({"goal": "x", "sae_id": "sae_nope"}, 400, "sae_not_attached", "sae_id"),
        ({"goal": "x", "surprise": 1}, 400, None, "surprise"),
        ({"goal": "x", "include": [10**6]}, 400, "invalid_feature_index", "include[0]"),
        ({"goal": "x", "include": [3, 3]}, 400, None, "include"),
        ({"goal": "x", "rank_by": "vibes"}, 400, None, "rank_by"),
    ],
)
def test_refusals(server, body, status, code, param):
    response = post(server, "/api/autosteer", body)
    got = error(response, status, code)
    if param is not None:
        assert got["param"] == param


def test_a_taken_profile_name_is_refused_before_the_job_starts(server):
    assert post(server, "/api/profiles", {"name": "taken-name", "steering": []}).status_code in (
        200,
        201,
    )
    error(
        post(server, "/api/autosteer", {"goal": "paris", "save_as": "taken-name"}),
        409,
        "profile_exists",
    )


def test_a_goal_no_label_matches_fails_the_job_with_the_reason(server):
    job = finished_job(
        server,
        post(server, "/api/autosteer", {"goal": "qqqq", "probe_prompts": PROBES[:1]}).json()["id"],
    )
    assert job["state"] == "failed"
    assert job["error"]["param"] == "goal" and "no candidate features" in job["error"]["message"]
