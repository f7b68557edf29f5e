"""Explaining SAE features on a live server (tiny Llama, a TopK SAE at layer 1, calibrated on
texts): the examples the explainer reads equal delphi's windows over activations captured offline
(a stock transformers model, a hook, the SAE's encode), the served scorer's detection score equals
the stock model's P([1]) arithmetic, an endpoint scorer's reading, an explainer that fails midway
keeps what was written, and the refusals.

The explainer here is an OpenAI-compatible endpoint on 127.0.0.1 that answers every explainer
chat with a fixed `[EXPLANATION]:` line (a random-weight model writes none) and records what it
was asked; what is under test is millm's job, not the explainer's wit."""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np
import pytest
import torch

from millm.engine.prompts import chat_prompt_ids
from millm.interp.formats import read_sae
from millm.lab.labels.explain_examples import choose, fuzzed_marks, marks_per_window, windows
from millm.lab.labels.explain_prompts import (
    detection_messages,
    explainer_messages,
    fuzz_marks,
    fuzzing_messages,
    marked,
)
from millm.lab.labels.explain_scoring import ScoredText, balanced_score
from tests.api.clients import MODEL, api, error, post
from tests.support.explainer_endpoint import Explainer
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

LAYER = 1
TEXTS = [
    f"{subject} {ending}"
    for subject in ("The old river", "A small cat", "Paris", "My friend", "The model")
    for ending in ("runs quickly to the sea and back again.", "is the city of France, they say.")
]
WIDTH, TOP, HELD = 8, 3, 4


@pytest.fixture(scope="module")
def explainer():
    endpoint = Explainer()
    yield endpoint
    endpoint.server.shutdown()


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    return build_saelens(
        tmp_path_factory.mktemp("explain-sae") / "sae", layer=LAYER, architecture="topk", seed=71
    )


def corpus_tokens(tiny_dirs) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    return sum(len(tokenizer(text)["input_ids"]) for text in TEXTS)


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dir, explainer):
    env = {
        "MILLM_EXPLAINER_BASE_URL": explainer.url,
        "MILLM_EXPLAINER_MODEL": "fixed",
        "MILLM_EXPLAIN_MAX_FEATURES": "6",
        # Four features' float32 activations over the texts: three fit, five do not.
        "MILLM_EXPLAIN_MAX_ACTIVATION_BYTES": str(4 * 4 * corpus_tokens(tiny_dirs)),
    }
    process = ServerProcess(
        tmp_path_factory.mktemp("explain-home"), ["--model", str(tiny_dirs["llama"])], env=env
    ).wait_ready()
    try:
        sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{sae}/attach", {}).status_code == 200
        yield process, sae
    finally:
        process.stop()


def wait_job(process, job_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api(process, "GET", f"/api/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running after {timeout} s")


@pytest.fixture(scope="module")
def calibrated(server):
    process, sae = server
    started = post(process, f"/api/saes/{sae}/calibrate", {"texts": TEXTS, "top_examples": 3})
    assert started.status_code == 202, started.text
    assert wait_job(process, started.json()["id"])["state"] == "succeeded"
    return server


@pytest.fixture(scope="module")
def offline(tiny_dirs, sae_dir):
    """The stock model and tokenizer, and each text's SAE activations at every position."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    sae = read_sae(sae_dir)[1]
    captured = {}
    model.model.layers[LAYER].register_forward_hook(
        lambda m, a, out: captured.__setitem__("resid", out[0] if isinstance(out, tuple) else out)
    )
    ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    acts = []
    for one in ids:
        with torch.no_grad():
            model(torch.tensor([one]))
            dense = sae.encode(captured["resid"][0]).numpy()
        dense[0] = 0  # position 0 (the attention sink) is never read
        acts.append(dense)
    return {"model": model, "tokenizer": tokenizer, "ids": ids, "acts": acts}


def fired_features(offline, count: int) -> list[int]:
    total = sum((a > 0).sum(0) for a in offline["acts"])
    return [int(f) for f in np.argsort(-total, kind="stable")[:count]]


def explain(process, sae: str, body: dict):
    return post(process, f"/api/saes/{sae}/labels/explain", body)


def offline_examples(offline, feature: int):
    every = []
    for text, ids in enumerate(offline["ids"]):
        every += windows(text, np.asarray(ids), offline["acts"][text][:, feature], WIDTH)
    return choose(every, top=TOP, quantiles=2, per_quantile=HELD // 2, seed=22)


def yes(tokenizer, model, chat) -> float:
    """The stock model's P("1") / (P("0") + P("1")) as the token after "[" of its answer to
    `chat`."""
    ids = chat_prompt_ids(tokenizer, chat) + tokenizer("[", add_special_tokens=False)["input_ids"]
    one = tokenizer("[1", add_special_tokens=False)["input_ids"][-1]
    zero = tokenizer("[0", add_special_tokens=False)["input_ids"][-1]
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([ids])).logits[0, -1], -1)
    return float(p[one] / (p[one] + p[zero]))


def strings(tokenizer, window) -> list[str]:
    return [tokenizer.decode([t]) for t in window.tokens]


def test_the_explainer_reads_delphis_windows_and_the_served_scorer_scores_them(
    calibrated, offline, explainer
):
    process, sae = calibrated
    features = fired_features(offline, 2)
    explainer.asked.clear()
    body = {  # no texts: the calibration kept the texts its request sent
        "features": features,
        "explainer": "endpoint",
        "scorer": "served",
        "top_examples": TOP,
        "held_out": HELD,
        "quantiles": 2,
        "width": WIDTH,
    }
    started = explain(process, sae, body)
    assert started.status_code == 202, started.text
    job = wait_job(process, started.json()["id"])
    assert job["state"] == "succeeded", job
    assert job["progress"] == {"done": 2, "total": 2, "unit": "features"}
    assert (job["result"]["sae_id"], job["result"]["features"]) == (sae, features)
    assert job["result"]["explained"] == 2 and job["result"]["skipped"] == []
    tokenizer, model = offline["tokenizer"], offline["model"]
    stored = {e["feature"]: e for e in api(process, "GET", f"/api/saes/{sae}/explanations").json()}
    for n, feature in enumerate(features):
        examples = offline_examples(offline, feature)
        # The explainer's chat holds the top windows, marked and scaled, exactly.
        shown = [(strings(tokenizer, w), list(w.activations)) for w in examples.top]
        want = explainer_messages(shown, examples.top[0].peak)
        got = explainer.asked[n]["messages"]
        assert got[:-1] == want[:-1]
        assert got[-1]["content"].split("\n")[1::2] == want[-1]["content"].split("\n")[1::2]
        for line_got, line_want in zip(
            got[-1]["content"].split("\n")[2::2], want[-1]["content"].split("\n")[2::2], strict=True
        ):
            assert line_got == line_want  # activations on delphi's 0-10 scale
        # ... and the top window's peak is the calibration's max of the feature.
        figure = api(
            process, "GET", f"/api/saes/{sae}/calibration", params={"features": str(feature)}
        ).json()["features"][0]
        assert examples.top[0].peak == pytest.approx(figure["max"], rel=1e-4)
        # The served scorer: P([1]) of the stock model after "[" on delphi's detection chat.
        explanation = f"pattern {n + 1}"
        judged = []
        p_yes = partial(yes, tokenizer, model)
        for window, fired in [(w, True) for w in examples.activating] + [
            (w, False) for w in examples.quiet
        ]:
            chat = detection_messages(explanation, "".join(strings(tokenizer, window)))
            judged.append(ScoredText(fired, p_yes(chat)))
        want_score = balanced_score(judged)
        # Fuzzing: activating windows marked where it fired, quiet ones at random tokens.
        rng = np.random.default_rng([22, feature])
        count = marks_per_window(examples.activating)
        fuzzed = [
            ScoredText(
                True,
                p_yes(
                    fuzzing_messages(
                        explanation, marked(strings(tokenizer, w), fuzz_marks(list(w.activations)))
                    )
                ),
            )
            for w in examples.activating
        ] + [
            ScoredText(
                False,
                p_yes(
                    fuzzing_messages(
                        explanation, marked(strings(tokenizer, w), fuzzed_marks(w, count, rng))
                    )
                ),
            )
            for w in examples.quiet
        ]
        assert stored[feature]["fuzzing"]["balanced_accuracy"] == pytest.approx(
            balanced_score(fuzzed).balanced_accuracy, abs=1e-9
        )
        assert count >= 1
        entry = stored[feature]
        assert entry["explanation"] == explanation and entry["explainer"] == "endpoint:fixed"
        assert entry["scorer"].startswith("served:") and entry["prompt_version"].startswith(
            "delphi 0.1.3"
        )
        assert entry["detection"]["balanced_accuracy"] == pytest.approx(
            want_score.balanced_accuracy, abs=1e-9
        )
        assert entry["detection"]["texts"] == len(judged) == want_score.texts
        assert want_score.activating >= 1 and want_score.quiet == want_score.activating
        assert entry["flagged"] == (want_score.balanced_accuracy < 0.6)


def test_a_job_reads_each_text_once_and_a_features_windows_do_not_depend_on_its_company(
    calibrated, offline, explainer
):
    """A job of three features reads every corpus text once (its result counts them), and the
    feature it shares with a job of its own gets the same windows: the same explainer chat and
    the same held-out texts (detection) and marks (fuzzing) put to the scorer."""
    process, sae = calibrated
    shared, *others = fired_features(offline, 3)
    body = {"explainer": "endpoint", "top_examples": TOP, "held_out": HELD, "quantiles": 2,
            "width": WIDTH}  # fmt: skip
    asked = {}
    for features in ([shared], [others[0], shared, others[1]]):
        explainer.asked.clear()
        explainer.scored.clear()
        job = wait_job(process, explain(process, sae, {**body, "features": features}).json()["id"])
        assert job["state"] == "succeeded", job
        assert job["result"]["texts"] == len(TEXTS)
        assert job["result"]["texts_read"] == len(TEXTS)  # once per job, not once per feature
        entry = next(e for e in job["result"]["explanations"] if e["feature"] == shared)
        # Its scorer chats, with the explanation (numbered by the endpoint) taken out.
        scored = [
            [
                {**m, "content": m["content"].replace(entry["explanation"], "…")}
                for m in b["messages"]
            ]
            for b in explainer.scored
            if entry["explanation"] in b["messages"][-1]["content"]
        ]
        assert len(scored) == entry["detection"]["texts"] + entry["fuzzing"]["texts"]
        asked[len(features)] = (explainer.asked[features.index(shared)]["messages"], scored)
    assert asked[1] == asked[3]


def test_an_endpoint_scorer_is_read_from_its_top_logprobs(calibrated, offline):
    process, sae = calibrated
    feature = fired_features(offline, 3)[2]
    body = {"features": [feature], "explainer": "endpoint", "top_examples": TOP, "held_out": HELD,
            "quantiles": 2, "width": WIDTH, "texts": TEXTS}  # fmt: skip
    job = wait_job(process, explain(process, sae, body).json()["id"])
    assert job["state"] == "succeeded", job
    detection = job["result"]["explanations"][0]["detection"]
    # P([1]) = 0.7 for every text: every text is called activating.
    assert detection["true_positive_rate"] == 1.0 and detection["true_negative_rate"] == 0.0
    assert detection["balanced_accuracy"] == 0.5 and detection["failed"] == 0
    assert job["result"]["explanations"][0]["fuzzing"]["balanced_accuracy"] == 0.5


def test_an_explainer_that_fails_midway_keeps_what_was_written(calibrated, offline, explainer):
    process, sae = calibrated
    features = fired_features(offline, 6)[3:6]
    before = api(process, "GET", f"/api/saes/{sae}/explanations").json()
    explainer.asked.clear()
    explainer.fail_after = 1
    try:
        body = {"features": features, "explainer": "endpoint", "top_examples": TOP,
                "held_out": HELD, "quantiles": 2, "width": WIDTH, "texts": TEXTS}  # fmt: skip
        job = wait_job(process, explain(process, sae, body).json()["id"])
    finally:
        explainer.fail_after = None
    assert job["state"] == "failed"
    assert "explainer endpoint" in job["error"]["message"] and "500" in job["error"]["message"]
    after = api(process, "GET", f"/api/saes/{sae}/explanations").json()
    assert {(e["feature"], e["explanation"]) for e in before} <= {
        (e["feature"], e["explanation"]) for e in after
    }
    assert [e["feature"] for e in after if e["feature"] in features] == [features[0]]


def test_a_job_that_wrote_nothing_fails_saying_why_and_shows_its_features_while_running(
    calibrated, offline, explainer
):
    """A running job's result names its SAE and features; a job whose explainer wrote no
    explanation line for any feature ends `failed` (nothing_explained), with the per-feature
    reasons in its result and its progress counted in features."""
    process, sae = calibrated
    features = fired_features(offline, 2)
    before = api(process, "GET", f"/api/saes/{sae}/explanations").json()
    explainer.silent, explainer.hold = True, threading.Event()
    try:
        body = {"features": features, "explainer": "endpoint", "top_examples": TOP,
                "held_out": HELD, "quantiles": 2, "width": WIDTH, "texts": TEXTS}  # fmt: skip
        started = explain(process, sae, body).json()
        assert started["description"] == f"explain 2 features of {sae} with endpoint:fixed"
        running = api(process, "GET", f"/api/jobs/{started['id']}").json()
        assert running["state"] == "running"
        assert (running["result"]["sae_id"], running["result"]["features"]) == (sae, features)
        assert running["progress"] == {"done": 0, "total": 2, "unit": "features"}
        explainer.hold.set()
        job = wait_job(process, started["id"])
    finally:
        explainer.silent, explainer.hold = False, None
    assert job["state"] == "failed" and job["error"]["code"] == "nothing_explained"
    reason = "the explainer's answer has no [EXPLANATION]: line"
    assert job["error"]["message"] == (
        f"no explanation was written for any of the 2 features (2 of them: {reason})"
    )
    assert job["progress"] == {"done": 2, "total": 2, "unit": "features"}
    assert job["result"]["explained"] == 0 and job["result"]["explanations"] == []
    assert [(s["feature"], s["reason"]) for s in job["result"]["skipped"]] == [
        (f, reason) for f in features
    ]
    assert api(process, "GET", f"/api/saes/{sae}/explanations").json() == before


def test_refusals_name_the_field(server, calibrated, sae_dir, tmp_path_factory):
    process, sae = calibrated
    other = build_saelens(tmp_path_factory.mktemp("explain-other") / "sae", layer=0, seed=9)
    fresh = post(process, "/api/saes", {"path": str(other)}).json()["id"]
    assert post(process, f"/api/saes/{fresh}/attach", {}).status_code == 200
    assert error(explain(process, fresh, {"features": [0]}), 400)["param"] == "sae_id"
    assert error(explain(process, sae, {"features": list(range(7))}), 400)["param"] == "features"
    assert (
        error(explain(process, sae, {"features": [0], "explainer": "oracle"}), 400)["param"]
        == "explainer"
    )
    assert error(explain(process, sae, {"features": [0], "range": {"start": 0, "end": 2}}), 400)
    assert error(explain(process, sae, {"features": [10**6]}), 400)["param"] == "features"
    assert error(explain(process, sae, {"features": [0], "texts": []}), 400)["param"] == "texts"
    held = error(explain(process, sae, {"features": [0, 1, 2, 3, 4], "texts": TEXTS}), 400)
    assert held["param"] == "features" and "MILLM_EXPLAIN_MAX_ACTIVATION_BYTES" in held["message"]


def test_a_features_own_label_is_scored_the_same_way_and_stays(calibrated, offline, explainer):
    process, sae = calibrated
    feature = fired_features(offline, 1)[0]
    label = api(process, "GET", f"/api/saes/{sae}/features/{feature}").json()["label"]
    explainer.asked.clear()
    body = {"features": [feature], "score_labels": True, "scorer": "endpoint", "top_examples": TOP,
            "held_out": HELD, "quantiles": 2, "width": WIDTH}  # fmt: skip
    job = wait_job(process, explain(process, sae, body).json()["id"])
    assert job["state"] == "succeeded", job
    assert explainer.asked == []  # nothing was written: the label is what is scored
    [scored] = job["result"]["explanations"]
    assert (scored["explanation"], scored["explainer"]) == (label, "label:sae_file")
    assert scored["detection"]["balanced_accuracy"] == 0.5  # the endpoint says yes to everything
    after = api(process, "GET", f"/api/saes/{sae}/features/{feature}").json()
    assert (after["label"], after["source"]) == (label, "sae_file")
    assert any(e["explainer"] == "label:sae_file" for e in after["explanations"])


def test_explanations_are_searched_beside_labels_ranked_by_their_score(calibrated, offline):
    process, sae = calibrated
    body = {"features": fired_features(offline, 3), "explainer": "endpoint", "scorer": "served",
            "top_examples": TOP, "held_out": HELD, "quantiles": 2, "width": WIDTH,
            "texts": TEXTS}  # fmt: skip
    assert wait_job(process, explain(process, sae, body).json()["id"])["state"] == "succeeded"
    stored = api(process, "GET", f"/api/saes/{sae}/explanations").json()
    by_feature = {}
    for entry in stored:
        by_feature.setdefault(entry["feature"], entry)
    assert len(by_feature) >= 2
    labelled, *others = sorted(by_feature)
    # The SAE's own labels cleared; a label a user brings for one explained feature stays its label.
    assert api(process, "DELETE", f"/api/saes/{sae}/labels").status_code == 200
    merged = api(process, "PATCH", f"/api/saes/{sae}/labels", json={str(labelled): "river bank"})
    assert merged.status_code == 200, merged.text
    found = api(process, "GET", f"/api/saes/{sae}/features", params={"q": "pattern", "limit": 50})
    data = found.json()["data"]
    explained = [m for m in data if m["source"] == "explained"]
    assert {m["index"] for m in explained} == set(others)
    for m in explained:
        best = max(
            (e for e in stored if e["feature"] == m["index"]),
            key=lambda e: e["detection"]["balanced_accuracy"],
        )
        assert m["label"] == best["explanation"]
        assert m["balanced_accuracy"] == pytest.approx(best["detection"]["balanced_accuracy"])
    # Equal words, so BM25 is equal up to the label's length: the score scales with accuracy.
    scores = [
        m["score"] / (2 * m["balanced_accuracy"]) for m in explained if m["balanced_accuracy"]
    ]
    assert max(scores) == pytest.approx(min(scores), rel=0.2)
    assert [m["score"] for m in data] == sorted((m["score"] for m in data), reverse=True)
    # The labelled feature is found through its explanation, under its own label.
    hit = next(m for m in data if m["index"] == labelled)
    assert (hit["label"], hit["source"], hit["balanced_accuracy"]) == ("river bank", "plain", None)
    detail = api(process, "GET", f"/api/saes/{sae}/features/{labelled}").json()
    assert detail["label"] == "river bank"
    assert [e["explanation"] for e in detail["explanations"]] == [
        e["explanation"] for e in stored if e["feature"] == labelled
    ]


@pytest.fixture(scope="module")
def gemma(tiny_dirs, calibrated):
    """The tiny Gemma 2 registered beside the served Llama (not loaded), and its stock model."""
    from transformers import AutoModelForCausalLM

    process, _ = calibrated
    registered = api(process, "POST", "/api/models", json={"source": str(tiny_dirs["gemma2"])})
    assert registered.status_code == 201, registered.text
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["gemma2"]), dtype=torch.float32)
    return registered.json()["id"], model.eval()


def test_another_registered_model_writes_and_scores_beside_the_served_one(
    calibrated, offline, gemma
):
    """A registered model that is not loaded writes and scores for the job: loaded beside the
    served model for its length, then freed. The explanation it writes is the stock Gemma's
    greedy line after "[EXPLANATION]:", its detection score the stock Gemma's P([1]) arithmetic
    on that explanation; the served model stays the one loaded and answers afterwards."""
    from millm.lab.labels.explain_prompts import parsed_explanation

    process, sae = calibrated
    name, model = gemma
    tokenizer = offline["tokenizer"]  # the Gemma's too: both tiny models share one tokenizer
    feature = fired_features(offline, 4)[3]
    body = {"features": [feature], "top_examples": TOP, "held_out": HELD, "quantiles": 2,
            "width": WIDTH, "texts": TEXTS, "scoring": ["detection"], "explainer": "model",
            "explainer_model": name, "max_tokens": 16}  # fmt: skip
    job = wait_job(process, explain(process, sae, body).json()["id"])
    assert job["state"] == "succeeded", job
    examples = offline_examples(offline, feature)
    shown = [(strings(tokenizer, w), list(w.activations)) for w in examples.top]
    chat = explainer_messages(shown, examples.top[0].peak)
    ids = chat_prompt_ids(tokenizer, [*chat, {"role": "assistant", "content": "[EXPLANATION]:"}])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
    continued = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).split("\n")[0]
    want = parsed_explanation("[EXPLANATION]:" + continued)
    assert want is not None  # the random Gemma writes a line here (measured: "\ufffd< fou")
    [entry] = job["result"]["explanations"]
    assert entry["explanation"] == want
    assert entry["explainer"] == entry["scorer"] == f"model:{name}"
    judged = [
        ScoredText(fired, yes(tokenizer, model, detection_messages(want, text)))
        for fired, text in [(True, "".join(strings(tokenizer, w))) for w in examples.activating]
        + [(False, "".join(strings(tokenizer, w))) for w in examples.quiet]
    ]
    assert entry["detection"]["balanced_accuracy"] == pytest.approx(
        balanced_score(judged).balanced_accuracy, abs=1e-9
    )
    models = {m["id"]: m["state"] for m in api(process, "GET", "/api/models").json()["data"]}
    assert models[name] != "loaded" and list(models.values()).count("loaded") == 1
    chat_ok = post(process, "/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                   "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert chat_ok.status_code == 200, chat_ok.text


def test_a_registered_explainer_is_named_and_checked_before_the_job(calibrated, gemma):
    process, sae = calibrated
    name, _ = gemma
    asked = {"features": [0], "texts": TEXTS}
    found = error(explain(process, sae, {**asked, "explainer": "model"}), 400)
    assert found["param"] == "explainer_model"
    found = error(explain(process, sae, {**asked, "explainer_model": name}), 400)
    assert found["param"] == "explainer_model"
    unknown = {**asked, "explainer": "model", "explainer_model": "nope"}
    found = error(explain(process, sae, unknown), 400)
    assert found["param"] == "explainer_model" and found["code"] == "model_not_found"
    two = {**asked, "explainer": "model", "explainer_model": name, "scorer": "model",
           "scorer_model": "tiny-llama-plain"}  # fmt: skip
    assert error(explain(process, sae, two), 400)["param"] == "scorer_model"
