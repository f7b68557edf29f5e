"""POST /api/probes/score on a live server (tiny Llama, a TopK SAE attached at layer 1): scores
equal a live request's verdict, per window (all, prompt, response, last_user) with each window's
boundary, unsteered whatever is live, recording nothing, every saved probe that fits when none is
named, and every refusal."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.api.clients import MODEL, api, error, post, sdk
from tests.support.batch_files import jsonl, lines_of, wait
from tests.support.probe_server import probe_saes, probe_server

PROMPT = "The old river runs quickly to the sea, and"
COMPLETION = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
SCORE = "/api/probes/score"
BAD = "invalid_parameter"  # a field millm refuses, named in `param`
SEA = [
    {"role": "user", "content": "Tell me about the sea."},
    {"role": "assistant", "content": "The sea is wide and deep."},
]


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    return probe_saes(tmp_path_factory.mktemp("score-saes"))


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dirs):
    with probe_server(
        tmp_path_factory.mktemp("score-home"), tiny_dirs["llama"], sae_dirs
    ) as process:
        yield process


@pytest.fixture
def quiet(server):
    """No saved probes, no live steering, monitoring off."""
    for probe in api(server, "GET", "/api/probes").json()["data"]:
        api(server, "DELETE", f"/api/probes/{probe['id']}")
    assert api(server, "DELETE", "/api/steering/features").status_code == 200
    api(server, "PUT", "/api/monitoring", json={"enabled": False})
    return server


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs):
    return AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))


def feature(server, index: int, threshold: float) -> dict:
    return {"type": "feature", "sae_id": server.sae, "index": index, "threshold": threshold}


def fed_tokens(server) -> list[int]:
    """Every position's token the model was fed for COMPLETION (the prompt, then each generated
    token but the last)."""
    ask = {"sae_id": server.sae, "positions": "all", "top_k": 1}
    answer = post(server, "/v1/completions", {**COMPLETION, "return_sae_activations": ask}).json()
    return [p["token_id"] for p in answer["millm"]["sae_activations"]["positions"]]


def scored(server, body: dict) -> dict:
    response = post(server, SCORE, body)
    assert response.status_code == 200, response.text
    return response.json()


def by_window(result: dict) -> dict:
    return {(v["probe"], v["window"]): v for v in result["verdicts"]}


def busiest_feature(server, ids: list[int]) -> tuple[int, list[float]]:
    """The feature that fires at most positions of `ids`, and its activation at each."""
    ask = {"sae_id": server.sae, "positions": "all", "top_k": 64}
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "return_sae_activations": ask}
    positions = post(server, "/v1/completions", body).json()["millm"]["sae_activations"]
    counts: dict[int, int] = {}
    for position in positions["positions"][1:]:
        for entry in position["features"]:
            counts[entry["index"]] = counts.get(entry["index"], 0) + 1
    index = max(counts, key=lambda i: (counts[i], -i))
    return index, [
        next((e["value"] for e in p["features"] if e["index"] == index), 0.0)
        for p in positions["positions"]
    ]


def test_scores_equal_a_live_requests_verdict_per_window(quiet, tokenizer):
    ids = fed_tokens(quiet)
    prompt_tokens = len(tokenizer(PROMPT)["input_ids"])
    assert 0 < prompt_tokens < len(ids)
    index, values = busiest_feature(quiet, ids)
    fired_values = sorted(v for v in values[1:] if v > 0)
    threshold = fired_values[len(fired_values) // 2]  # some positions fire, some do not
    river = {"name": "river", "detector": feature(quiet, index, threshold)}
    assert post(quiet, "/api/probes", river).status_code == 201
    linear = {"type": "linear", "layer": 1, "weights": [0.05] * 64, "bias": 0.0, "threshold": 0.5}
    probes = ["river", {"name": "lin", "detector": linear}]
    live = post(quiet, "/v1/completions", {**COMPLETION, "probes": probes}).json()
    verdicts = {entry["name"]: entry for entry in live["millm"]["probes"]}
    body = {
        "probes": probes,
        "inputs": [{"token_ids": ids, "prompt_tokens": prompt_tokens}],
        "windows": ["all", "prompt", "response"],
        "return_token_ids": True,
    }
    answer = scored(quiet, body)
    assert answer["model"] == MODEL and answer["skipped"] == []
    assert [(p["name"], p["source"], p["read_point"]) for p in answer["probes"]] == [
        ("river", "saved", 1),
        ("lin", "inline", 1),
    ]
    [result] = answer["results"]
    assert (result["n_tokens"], result["prompt_tokens"], result["token_ids"]) == (
        len(ids),
        prompt_tokens,
        ids,
    )
    windows = by_window(result)
    for name in ("river", "lin"):
        whole, seen = windows[(name, "all")], verdicts[name]
        assert whole["fired"] == seen["fired"]
        assert whole["positions"] == seen["positions"]
        assert whole["first_position"] == seen["first_position"]
        assert whole["peak_position"] == seen["peak_position"]
        assert abs(whole["peak"] - seen["peak"]) <= 0.001
        assert whole["scored_positions"] == len(ids) - 1  # position 0 is never scored
        prompt, response = windows[(name, "prompt")], windows[(name, "response")]
        assert prompt["scored_positions"] == prompt_tokens - 1
        assert response["scored_positions"] == len(ids) - prompt_tokens
        assert prompt["positions"] + response["positions"] == whole["positions"]
        assert max(prompt["peak"], response["peak"]) == whole["peak"]
    whole = windows[("river", "all")]
    assert whole["fired"] and 0 < len(whole["positions"]) < len(ids) - 1
    assert whole["threshold"] == threshold
    # A score exactly on the threshold fires.
    on_the_bar = {"name": "bar", "detector": feature(quiet, index, whole["peak"])}
    again = scored(quiet, {"probes": [on_the_bar], "inputs": body["inputs"]})
    [verdict] = again["results"][0]["verdicts"]
    assert verdict["fired"] and whole["peak_position"] in verdict["positions"]


def test_scores_are_unsteered_and_record_nothing(quiet):
    ids = fed_tokens(quiet)
    body = {
        "probes": [{"name": "any", "detector": feature(quiet, 3, 0.01)}],
        "inputs": [{"token_ids": ids}, {"text": PROMPT}],
    }
    before = scored(quiet, body)
    assert api(quiet, "POST", "/api/monitoring/enable").status_code == 200
    strength = {"strength": 40}
    path = f"/api/steering/saes/{quiet.sae}/features/3"
    assert api(quiet, "PUT", path, json=strength).status_code == 200
    steered = post(quiet, "/v1/completions", {**COMPLETION, "probes": body["probes"]}).json()
    assert steered["millm"]["probes"]  # the live request is watched (and steered)
    after = scored(quiet, body)
    assert after["results"] == before["results"]
    records = api(quiet, "GET", "/api/monitoring/records", params={"limit": 100}).json()["data"]
    assert len(records) == 1  # the live request's own, none of the scoring's
    assert api(quiet, "GET", "/api/probes").json()["data"] == []  # nothing saved


def test_windows_follow_each_inputs_boundaries(quiet, tokenizer):
    probe = {"name": "low", "detector": feature(quiet, 3, 0.0001)}
    windows = ["all", "prompt", "response", "last_user"]
    inputs = [
        {"messages": SEA},
        {"messages": SEA[:1]},
        {"token_ids": [1, 20, 30, 40]},
        {"text": "A small boat"},
    ]
    answer = scored(
        quiet, {"probes": [probe], "inputs": inputs, "windows": windows, "return_token_ids": True}
    )
    chat, question, tokens, text = answer["results"]
    head = tokenizer.apply_chat_template(SEA[:1], add_generation_prompt=True, tokenize=True)
    head = list(head["input_ids"] if hasattr(head, "keys") else head)
    assert chat["token_ids"][: len(head)] == head and chat["prompt_tokens"] == len(head)
    verdicts = {v["window"]: v for v in chat["verdicts"]}
    assert verdicts["response"]["scored_positions"] == chat["n_tokens"] - len(head)
    start, end = verdicts["last_user"]["span"]
    assert tokenizer.decode(chat["token_ids"][start:end]).strip() == SEA[0]["content"]
    assert verdicts["last_user"]["scored_positions"] == end - start
    assert verdicts["response"]["span"] == [len(head), chat["n_tokens"]]
    # A conversation without the assistant's turn is all prompt: no response to score.
    asked = {v["window"]: v for v in question["verdicts"]}
    assert question["prompt_tokens"] == question["n_tokens"] == len(head)
    assert (asked["response"]["fired"], asked["response"]["not_scored_reason"]) == (
        None,
        "window_empty",
    )
    assert asked["last_user"]["span"] == [start, end]
    plain = {v["window"]: v for v in tokens["verdicts"]}
    assert tokens["prompt_tokens"] is None
    for window, reason in (
        ("prompt", "prompt_boundary_unknown"),
        ("response", "prompt_boundary_unknown"),
        ("last_user", "token_ids_have_no_turns"),
    ):
        assert (plain[window]["fired"], plain[window]["not_scored_reason"]) == (None, reason)
    assert plain["all"]["scored_positions"] == 3
    said = {v["window"]: v for v in text["verdicts"]}
    assert text["token_ids"] == tokenizer("A small boat")["input_ids"]
    assert said["last_user"]["not_scored_reason"] == "text_has_no_turns"


def test_unnamed_probes_are_every_saved_one_that_fits(quiet):
    fits = {"name": "fits", "detector": feature(quiet, 5, 0.5)}
    detached = {"name": "detached", "detector": {**feature(quiet, 5, 0.5), "sae_id": quiet.other}}
    for probe in (fits, detached):
        assert post(quiet, "/api/probes", probe).status_code == 201
    answer = scored(quiet, {"inputs": [{"text": PROMPT}]})
    assert [p["name"] for p in answer["probes"]] == ["fits"]
    [skipped] = answer["skipped"]
    assert skipped["name"] == "detached" and quiet.other in skipped["reason"]
    api(quiet, "DELETE", "/api/probes/fits")
    refused = error(post(quiet, SCORE, {"inputs": [{"text": PROMPT}]}), 400, "invalid_parameter")
    assert refused["param"] == "probes" and "1 skipped" in refused["message"]


@pytest.mark.parametrize(
    ("inputs", "param", "code"),
    [
        ([], "inputs", BAD),
        ([{"text": "x"}] * 65, "inputs", BAD),
        ([{"token_ids": [1, 400]}], "inputs[0].token_ids[1]", BAD),
        ([{"token_ids": [1, 2], "prompt_tokens": 3}], "inputs[0].prompt_tokens", BAD),
        ([{"token_ids": [1] * 2049}], "inputs[0]", "context_length_exceeded"),
        ([{"token_ids": [1, 2], "text": "x"}], "inputs[0]", BAD),
        ([{"text": ""}], "inputs[0]", BAD),
    ],
    ids=["none", "too-many", "vocabulary", "prompt-past-end", "context", "two-kinds", "empty"],
)
def test_a_bad_input_is_refused_naming_it(quiet, inputs, param, code):
    probe = {"name": "p", "detector": feature(quiet, 3, 1.0)}
    refused = error(post(quiet, SCORE, {"probes": [probe], "inputs": inputs}), 400, code)
    assert refused["param"].startswith(param), refused


def test_bad_probes_and_fields_are_refused_naming_them(quiet):
    text = [{"text": PROMPT}]
    missing = error(post(quiet, SCORE, {"probes": ["nobody"], "inputs": text}), 404)
    assert (missing["code"], missing["param"]) == ("probe_not_found", "probes[0]")
    detached = {"name": "d", "detector": {**feature(quiet, 3, 1.0), "sae_id": quiet.other}}
    refused = error(post(quiet, SCORE, {"probes": [detached], "inputs": text}), 400)
    assert (refused["code"], refused["param"]) == ("sae_not_attached", "probes[0].detector.sae_id")
    probe = {"name": "p", "detector": feature(quiet, 3, 1.0)}
    body = {"probes": [probe], "inputs": text}
    window = error(post(quiet, SCORE, {**body, "windows": ["tail"]}), 400)
    assert window["param"].startswith("windows")
    misspelt = error(post(quiet, SCORE, {**body, "window": ["all"]}), 400)
    assert misspelt["param"] == "window"


def test_batch_lines_score_as_the_route_does_on_the_loaded_model(quiet):
    """A batch naming /api/probes/score runs each line on the resident model (its lines name
    none) and answers it as the route would; a line the route would refuse is an error line."""
    probes = [{"name": "any", "detector": feature(quiet, 3, 0.01)}]
    bodies = [
        {"probes": probes, "inputs": [{"text": PROMPT}], "windows": ["all", "prompt"]},
        {"probes": probes, "inputs": [{"messages": SEA}], "windows": ["response", "last_user"]},
    ]
    entries = [
        {"custom_id": f"line-{i}", "method": "POST", "url": SCORE, "body": body}
        for i, body in enumerate(bodies)
    ]
    entries.append(
        {
            "custom_id": "bad",
            "method": "POST",
            "url": SCORE,
            "body": {"probes": probes, "inputs": []},
        }
    )
    client = sdk(quiet)
    stored = client.files.create(file=("in.jsonl", jsonl(entries)), purpose="batch")
    batch = client.batches.create(
        input_file_id=stored.id,
        endpoint=SCORE,
        completion_window="24h",  # type: ignore[arg-type]
    )
    done = wait(client, batch.id)
    assert done.status == "completed" and done.model == MODEL
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    answers = {line["custom_id"]: line for line in lines_of(client, done.output_file_id)}
    for i, body in enumerate(bodies):
        response = answers[f"line-{i}"]["response"]
        assert response["status_code"] == 200 and response["body"] == scored(quiet, body)
        assert response["millm"]["headers"] == {} and response["millm"]["packed"] is False
    [refused] = lines_of(client, done.error_file_id)
    assert refused["custom_id"] == "bad" and refused["response"] is None
    assert refused["error"]["code"] == "invalid_request" and "inputs" in refused["error"]["message"]


def test_batch_lines_with_no_model_loaded_are_refused_as_not_loaded(quiet):
    probes = [{"name": "any", "detector": feature(quiet, 3, 0.01)}]
    entry = {
        "custom_id": "one",
        "method": "POST",
        "url": SCORE,
        "body": {"probes": probes, "inputs": [{"text": PROMPT}]},
    }
    client = sdk(quiet)
    stored = client.files.create(file=("in.jsonl", jsonl([entry])), purpose="batch")
    assert api(quiet, "POST", f"/api/models/{MODEL}/unload").status_code == 200
    try:
        batch = client.batches.create(
            input_file_id=stored.id,
            endpoint=SCORE,
            completion_window="24h",  # type: ignore[arg-type]
        )
        done = wait(client, batch.id)
        assert done.status == "failed" and done.errors.data[0].code == "model_not_loaded"
    finally:
        assert api(quiet, "POST", f"/api/models/{MODEL}/load").status_code == 200
