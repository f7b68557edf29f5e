"""Steering evaluations (issue 34, beyond the spec): a concept, instructions and candidates swept
over strengths, run as a job on a live server; every number held against the routes it is made
of (the answers against /v1 greedy answers under the same steering, the ratings against /v1
scoring over the digit tokens, perplexity against echo's prompt log-probabilities), stored,
exported, cancelled, and judged by a remote OpenAI-compatible server."""

from __future__ import annotations

import csv
import io
import math
import time

import pytest
from transformers import AutoTokenizer

from millm.engine.prompts import chat_prompt_ids
from tests.api.clients import MODEL, api, error, finished_job, llama_with_sae, post

CONCEPT = "rivers"
INSTRUCTIONS = ["Tell me about the city.", "Describe your day."]
MAX_TOKENS = 6
STRENGTHS = [0.0, 40.0]


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs):
    return AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, llama_server):
    """The tiny Llama with an SAE attached, whose remote judge is another server on the same
    weights."""
    env = {"MILLM_JUDGE_BASE_URL": f"{llama_server.base_url}/v1", "MILLM_JUDGE_MODEL": MODEL}
    with llama_with_sae(tiny_dirs, tmp_path_factory.mktemp("eval"), seed=21, env=env) as process:
        yield process


@pytest.fixture(scope="module")
def sae_id(server):
    return api(server, "GET", "/api/saes").json()["data"][0]["id"]


def evaluate(server, **body) -> dict:
    started = post(server, "/api/evaluations", body)
    assert started.status_code == 202, started.text
    job = finished_job(server, started.json()["id"])
    assert job["state"] == "succeeded", job
    return job["result"]


@pytest.fixture(scope="module")
def result(server, sae_id):
    api(server, "POST", "/api/profiles", json={"name": "p", "steering": []})
    return evaluate(
        server,
        concept=CONCEPT,
        instructions=INSTRUCTIONS,
        max_tokens=MAX_TOKENS,
        name="first",
        candidates=[
            {"kind": "feature", "index": 3, "strengths": STRENGTHS},
            {"kind": "prompt"},
            {"kind": "profile", "profile": "p", "intensities": [0.5]},
        ],
    )


def greedy(server, instruction: str, **extra) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": instruction}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        **extra,
    }
    answer = post(server, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"]["content"]


def direct_rating(server, tokenizer, question: str) -> float:
    """The rating /v1 scoring gives: the next token over the three digits, sum(k * P(k))."""
    digits = [tokenizer(d, add_special_tokens=False)["input_ids"][0] for d in "012"]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 1,
        "allowed_token_ids": digits,
        "logprobs": True,
        "top_logprobs": 3,
        "return_tokens_as_token_ids": True,
    }
    scored = post(server, "/v1/chat/completions", body)
    assert scored.status_code == 200, scored.text
    top = scored.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    probability = {int(e["token"].split(":")[1]): math.exp(e["logprob"]) for e in top}
    return sum(k * probability[d] for k, d in enumerate(digits)) / sum(probability.values())


def test_the_answers_are_the_v1_answers_under_the_same_steering(server, result, sae_id):
    baseline = result["baseline"]
    assert [s["text"] for s in baseline["samples"]] == [greedy(server, i) for i in INSTRUCTIONS]
    feature = result["candidates"][0]
    assert feature["label"].startswith("feature 3") and feature["kind"] == "feature"
    assert [p["strength"] for p in feature["points"]] == STRENGTHS
    zero, strong = feature["points"]
    assert [s["text"] for s in zero["samples"]] == [s["text"] for s in baseline["samples"]]
    steering = {
        "steering": [{"sae_id": sae_id, "features": [{"index": 3, "op": "add", "strength": 40.0}]}]
    }
    steered = [greedy(server, i, steering=steering) for i in INSTRUCTIONS]
    assert [s["text"] for s in strong["samples"]] == steered
    assert steered != [s["text"] for s in baseline["samples"]]
    prompted = result["candidates"][1]["points"][0]["samples"]
    system = f"In every answer, talk about {CONCEPT}, while still following the user's instruction."
    for sample, instruction in zip(prompted, INSTRUCTIONS, strict=True):
        body = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": instruction},
            ],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        }
        assert (
            sample["text"]
            == post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
        )


@pytest.fixture(scope="module")
def rated(server):
    """A run whose judge is the model answering AxBench's rating questions."""
    return evaluate(
        server,
        concept=CONCEPT,
        instructions=INSTRUCTIONS,
        max_tokens=MAX_TOKENS,
        judge="rating",
        candidates=[{"kind": "feature", "index": 3, "strengths": [40.0]}],
    )


def summed(server, tokenizer, system: str | None, instruction: str, text: str) -> tuple[float, int]:
    """The answer's summed log-likelihood after the chat prompt, and its token count, from echo."""
    messages = [{"role": "system", "content": system}] if system else []
    prompt = chat_prompt_ids(tokenizer, [*messages, {"role": "user", "content": instruction}])
    answer = tokenizer(text, add_special_tokens=False)["input_ids"]
    body = {"model": MODEL, "prompt": prompt + answer, "echo": True, "logprobs": 0, "max_tokens": 0}
    scored = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"][
        "token_logprobs"
    ]
    return sum(scored[len(prompt) :]), len(answer)


def test_the_likelihood_judge_reads_the_models_posteriors(server, result, tokenizer):
    judge = result["judge"]
    assert judge["kind"] == "likelihood" and judge["model"] == MODEL
    hypotheses = judge["instructions"]  # the run's, then the built-in ones
    assert hypotheses[:2] == INSTRUCTIONS and len(hypotheses) == len(set(hypotheses)) > 2
    reference = result["baseline"]["perplexity"]
    for sample in result["candidates"][0]["points"][1]["samples"]:
        instruction, text = INSTRUCTIONS[sample["instruction"]], sample["text"]
        goal = summed(
            server, tokenizer, judge["concept_system"].format(concept=CONCEPT), instruction, text
        )[0]
        neutral = summed(server, tokenizer, judge["neutral_system"], instruction, text)[0]
        assert sample["concept"] == pytest.approx(2 / (1 + math.exp(neutral - goal)), abs=1e-3)
        sums = [summed(server, tokenizer, None, h, text)[0] for h in hypotheses]
        top = max(sums)
        own = math.exp(sums[hypotheses.index(instruction)] - top) / sum(
            math.exp(s - top) for s in sums
        )
        assert sample["instruction_score"] == pytest.approx(2 * own, abs=1e-3)
        assert sample["fluency"] == pytest.approx(
            2 * min(1.0, reference / sample["perplexity"]), abs=1e-3
        )


def test_ratings_are_the_models_scoring_over_the_digits(server, rated, tokenizer):
    prompts = rated["rating_prompts"]
    assert rated["judge"] == {"kind": "rating", "model": MODEL}
    for point in (rated["baseline"], rated["candidates"][0]["points"][0]):
        for sample in point["samples"]:
            fields = {
                "concept": CONCEPT,
                "instruction": INSTRUCTIONS[sample["instruction"]],
                "text": sample["text"].strip() or "(empty)",
            }
            for name, key in (
                ("concept", "concept"),
                ("instruction", "instruction_score"),
                ("fluency", "fluency"),
            ):
                expected = direct_rating(server, tokenizer, prompts[name].format(**fields))
                assert sample[key] == pytest.approx(expected, abs=1e-4), name
                assert 0 <= sample[key] <= 2
            c, i, f = sample["concept"], sample["instruction_score"], sample["fluency"]
            assert sample["harmonic_mean"] == pytest.approx(3 / (1 / c + 1 / i + 1 / f), abs=2e-4)
        assert point["harmonic_mean"] == pytest.approx(
            sum(s["harmonic_mean"] for s in point["samples"]) / len(point["samples"]), abs=1e-4
        )


def test_perplexity_is_the_unsteered_models_on_the_answer(server, result, tokenizer):
    for sample in result["candidates"][0]["points"][1]["samples"]:
        prompt = chat_prompt_ids(
            tokenizer, [{"role": "user", "content": INSTRUCTIONS[sample["instruction"]]}]
        )
        answer = tokenizer(sample["text"], add_special_tokens=False)["input_ids"]
        body = {
            "model": MODEL,
            "prompt": prompt + answer,
            "echo": True,
            "logprobs": 0,
            "max_tokens": 0,
        }
        scored = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"][
            "token_logprobs"
        ]
        tail = scored[len(prompt) :]
        assert sample["perplexity"] == pytest.approx(math.exp(-sum(tail) / len(tail)), rel=1e-3)


def test_best_points_and_the_ranking(result):
    for candidate in result["candidates"]:
        best = max(candidate["points"], key=lambda p: p["harmonic_mean"])
        assert candidate["best"]["harmonic_mean"] == best["harmonic_mean"]
    ranking = result["ranking"]
    assert [r["harmonic_mean"] for r in ranking] == sorted(
        (r["harmonic_mean"] for r in ranking), reverse=True
    )
    assert {r["label"] for r in ranking} == {"unsteered", "prompting", "profile p"} | {
        result["candidates"][0]["label"]
    }
    assert result["complete"] is True and result["candidates"][2]["points"][0]["strength"] == 0.5


def test_stored_listed_exported_and_deleted(server, result):
    listed = api(server, "GET", "/api/evaluations").json()["data"]
    assert result["id"] in [e["id"] for e in listed]
    assert api(server, "GET", f"/api/evaluations/{result['id']}").json() == result
    exported = api(server, "GET", f"/api/evaluations/{result['id']}/export")
    assert exported.json() == result and "attachment" in exported.headers["content-disposition"]
    as_csv = api(server, "GET", f"/api/evaluations/{result['id']}/export", params={"format": "csv"})
    assert as_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert len(rows) == (1 + 2 + 1 + 1) * len(INSTRUCTIONS)
    first = rows[0]
    assert (first["candidate"], first["instruction"]) == ("unsteered", INSTRUCTIONS[0])
    assert float(first["concept"]) == result["baseline"]["samples"][0]["concept"]
    copy = evaluate(
        server, concept="x", instructions=["Hi"], max_tokens=2, candidates=[{"kind": "prompt"}]
    )
    assert api(server, "DELETE", f"/api/evaluations/{copy['id']}").json()["deleted"] is True
    error(api(server, "GET", f"/api/evaluations/{copy['id']}"), 404, "evaluation_not_found")


def test_a_cancelled_evaluation_keeps_the_points_it_measured(server):
    body = {
        "concept": CONCEPT,
        "instructions": INSTRUCTIONS,
        "max_tokens": 24,
        "candidates": [
            {"kind": "feature", "index": i, "strengths": [5.0, 10.0, 20.0]} for i in range(6)
        ],
    }
    job_id = post(server, "/api/evaluations", body).json()["id"]
    until_started = time.monotonic() + 60
    while api(server, "GET", f"/api/jobs/{job_id}").json()["progress"]["done"] < 1:
        assert time.monotonic() < until_started
        time.sleep(0.05)
    assert api(server, "DELETE", f"/api/jobs/{job_id}").status_code == 200
    assert finished_job(server, job_id)["state"] == "cancelled"
    stored = [e for e in api(server, "GET", "/api/evaluations").json()["data"] if not e["complete"]]
    assert stored, "the cancelled evaluation was not stored"
    partial = api(server, "GET", f"/api/evaluations/{stored[0]['id']}").json()
    assert partial["baseline"] is not None and partial["job_id"] == job_id
    assert sum(len(c["points"]) for c in partial["candidates"]) < 18


def test_a_remote_judge_is_read_from_its_top_logprobs(server, llama_server, tokenizer):
    judged = evaluate(
        server,
        concept=CONCEPT,
        instructions=INSTRUCTIONS[:1],
        max_tokens=MAX_TOKENS,
        judge="remote",
        candidates=[{"kind": "prompt"}],
    )
    assert judged["judge"] == {
        "kind": "remote",
        "model": MODEL,
        "url": f"{llama_server.base_url}/v1/chat/completions",
    }
    sample = judged["baseline"]["samples"][0]
    question = judged["rating_prompts"]["concept"].format(
        concept=CONCEPT, instruction=INSTRUCTIONS[0], text=sample["text"].strip() or "(empty)"
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 20,
    }
    answer = post(llama_server, "/v1/chat/completions", body).json()["choices"][0]
    digits = {
        e["token"].strip(): math.exp(e["logprob"])
        for e in answer["logprobs"]["content"][0]["top_logprobs"]
        if e["token"].strip() in ("0", "1", "2")
    }
    if digits:
        expected = sum(int(d) * p for d, p in digits.items()) / sum(digits.values())
    else:
        text = answer["message"]["content"].strip()
        expected = float(text[0]) if text[:1] in ("0", "1", "2") else 0.0
    assert sample["concept"] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        (
            {"candidates": [{"kind": "feature", "index": 3, "strengths": [250.0]}]},
            "candidates[0].strengths[0]",
            None,
        ),
        (
            {"candidates": [{"kind": "feature", "index": 10**6, "strengths": [1.0]}]},
            "candidates[0].index",
            "invalid_feature_index",
        ),
        (
            {
                "candidates": [
                    {"kind": "feature", "sae_id": "sae_no", "index": 1, "strengths": [1.0]}
                ]
            },
            "candidates[0].sae_id",
            "sae_not_attached",
        ),
        ({"candidates": [{"kind": "variant", "variant": "nope"}]}, "candidates[0].variant", None),
        (
            {"candidates": [{"kind": "vector", "vector": "nope", "strengths": [1.0]}]},
            "candidates[0]",
            None,
        ),
        ({"candidates": [{"kind": "profile", "profile": "nope"}]}, "candidates[0]", None),
        (
            {
                "candidates": [{"kind": "feature", "index": 1, "strengths": [1.0] * 12}] * 12,
                "instructions": ["a"] * 50,
            },
            "candidates",
            None,
        ),
        ({"candidates": []}, "candidates", None),
        ({"candidates": [{"kind": "magic"}]}, "candidates[0]", None),
        ({"max_tokens": 0}, "max_tokens", None),
        ({"concept": ""}, "concept", None),
    ],
)
def test_bad_evaluations_are_refused_naming_the_field(server, change, param, code):
    body = {"concept": CONCEPT, "candidates": [{"kind": "prompt"}], **change}
    refused = error(post(server, "/api/evaluations", body), 400, code)
    assert refused["param"] == param, refused


def test_a_remote_judge_must_be_configured(llama_server):
    body = {"concept": CONCEPT, "candidates": [{"kind": "prompt"}], "judge": "remote"}
    assert error(post(llama_server, "/api/evaluations", body), 400)["param"] == "judge"
