"""Acceptance: Goodfire's `goodfire` SDK (0.3.5 from PyPI, unmodified, in its own environment)
against the demo server's Ember routes: every call answers what millm's own route answers, in
Ember's words and units (a feature's value is a fraction of its calibrated peak)."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.support.goodfire_sdk import run_sdk

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
SAE = "sae_262743630f92"
PIRATE, SAILING, FOOD, PASTA, ITALY = 1403, 828, 797, 1496, 1178
PIRATE_WORDS = ("pirate", "ship", "sea", "sail", "captain", "treasure", "crew", "voyage")
ITALIAN_WORDS = ("Italian", "Italy", "pasta", "pizza", "Margherita", "mozzarella", "prosciutto")


def sdk(server, code: str):
    return run_sdk(server.base_url, MODEL, code)


def millm(server, path: str, **params) -> dict:
    return httpx.get(f"{server.base_url}{path}", params=params, timeout=60).json()


def peak(server, index: int) -> float:
    """The feature's largest activation in the demo calibration: Ember's unit for it."""
    return millm(server, f"/api/saes/{SAE}/features/{index}", k=1)["calibration"]["max"]


def topical(text: str, words) -> int:
    return sum(text.lower().count(word.lower()) for word in words)


def test_features_are_the_demo_saes_features(demo_server):
    got = sdk(
        demo_server,
        """
        found = client.features.search("pirate", model=MODEL, top_k=5)
        pirate = found[0]
        looked = client.features.lookup([1403, 828], model=MODEL)
        listed = client.features._async_client  # the SDK lists features by id when it inspects
        from goodfire.utils.asyncio import run_async_safely
        by_id = run_async_safely(listed._list([str(looked[828].uuid), str(pirate.uuid)]))
        reranked = client.features.rerank(found, "pirate", model=MODEL, top_k=3)
        near = client.features.neighbors(pirate, model=MODEL, top_k=3)
        group = client.features.neighbors(found[0:2], model=MODEL, top_k=3)
        emit({
            "found": [[f.index_in_sae, f.label, str(f.uuid)] for f in found],
            "looked": {i: f.label for i, f in looked.items()},
            "by_id": [f.index_in_sae for f in by_id],
            "reranked": [f.index_in_sae for f in reranked],
            "near": [f.index_in_sae for f in near],
            "group": [f.index_in_sae for f in group],
        })
        """,
    )
    # Ember's search fuses words and meaning once the SAE's label embeddings are made (another
    # test may have made them on this server), and is by words until then.
    found = [(i, label) for i, label, _ in got["found"]]
    search = millm(demo_server, f"/api/saes/{SAE}/features", q="pirate", limit=5)["data"]
    if found != [(hit["index"], hit["label"]) for hit in search]:
        search = millm(demo_server, f"/api/saes/{SAE}/features", q="pirate", limit=5, by="both")[
            "data"
        ]
    assert found == [(hit["index"], hit["label"]) for hit in search]
    # the id holds the SAE's 12 digits, version 8, and the index after the variant bits
    index, _, uuid = got["found"][0]
    assert uuid == f"26274363-0f92-8000-8000-{index:012x}"
    assert got["looked"] == {"1403": "pirate / pirates / ates", "828": "train / sailing / ship"}
    assert got["by_id"] == [SAILING, PIRATE]
    assert got["reranked"] == [hit["index"] for hit in search[:3]]
    detail = millm(demo_server, f"/api/saes/{SAE}/features/{PIRATE}", k=3)
    assert got["near"] == [n["index"] for n in detail["neighbours"]]
    assert len(got["group"]) == 3 and not {PIRATE, search[1]["index"]} & set(got["group"])


def test_a_variants_value_is_a_fraction_of_the_features_calibrated_peak(demo_server):
    # The SDK reads the pirate feature under a nudge of 1.0; millm's own read under an add of
    # the feature's calibrated max gives the same activations, in Ember's units divided by it.
    conversation = [
        {"role": "user", "content": "Tell me about your weekend."},
        {"role": "assistant", "content": "I went sailing with friends."},
    ]
    got = sdk(
        demo_server,
        f"""
        variant = goodfire.Variant(MODEL)
        pirate = client.features.lookup([{PIRATE}], model=MODEL)[{PIRATE}]
        variant.set(pirate, 1.0)
        context = client.features.inspect({conversation!r}, model=variant, features=pirate)
        emit([
            {{a["index_in_sae"]: a["activation_strength"] for a in token._feature_acts}}
            for token in context.tokens
        ])
        """,
    )
    scale = peak(demo_server, PIRATE)
    body = {
        "model": MODEL,
        "messages": conversation,
        "max_tokens": 1,
        "temperature": 0,
        "steering": {
            "steering": [{"sae_id": SAE, "features": [{"index": PIRATE, "strength": scale}]}]
        },
        "return_sae_activations": {"features": [PIRATE], "positions": "prompt", "top_k": 1},
    }
    read = httpx.post(f"{demo_server.base_url}/v1/chat/completions", json=body, timeout=120)
    positions = read.json()["millm"]["sae_activations"]["positions"]
    assert len(got) == len(positions)
    compared = 0
    for ember, entry in zip(got[1:], positions[1:], strict=True):  # position 0: the sink
        value = entry["features"][0]["value"] / scale
        if value > 0:
            assert ember[str(PIRATE)] == pytest.approx(value, rel=0.02, abs=1e-3)
            compared += 1
    assert compared > 5  # steered at every position, the feature reads there


def test_a_nudged_variant_steers_whole_and_streamed(demo_server):
    got = sdk(
        demo_server,
        f"""
        features = client.features.lookup([{PIRATE}, {SAILING}], model=MODEL)
        variant = goodfire.Variant(MODEL)
        variant.set(features[{PIRATE}], 52 / {peak(demo_server, PIRATE)})
        variant.set(features[{SAILING}], 17 / {peak(demo_server, SAILING)})
        ask = [{{"role": "user", "content": "Tell me about your weekend."}}]
        plain = client.chat.completions.create(
            ask, model=MODEL, max_completion_tokens=60, temperature=0, system_prompt=""
        )
        whole = client.chat.completions.create(
            ask, model=variant, max_completion_tokens=60, temperature=0, system_prompt=""
        )
        chunks = list(client.chat.completions.create(
            ask, model=variant, max_completion_tokens=60, temperature=0, system_prompt="",
            stream=True,
        ))
        emit({{
            "plain": plain.choices[0].message["content"],
            "whole": whole.choices[0].message["content"],
            "streamed": "".join(c.choices[0].delta.content for c in chunks),
            "indices": [c.choices[0].gf_token_index for c in chunks],
            "reasons": [c.choices[0].finish_reason for c in chunks],
        }})
        """,
    )
    for steered in (got["whole"], got["streamed"]):
        assert topical(steered, PIRATE_WORDS) > topical(got["plain"], PIRATE_WORDS), got
    assert got["indices"] == list(range(len(got["indices"]))) and len(got["indices"]) > 5
    assert got["reasons"][-1] in ("length", "stop") and set(got["reasons"][:-1]) == {None}


def test_set_when_steers_once_the_condition_fires_and_abort_when_raises(demo_server):
    food, pasta, italy = (peak(demo_server, i) for i in (FOOD, PASTA, ITALY))
    got = sdk(
        demo_server,
        f"""
        f = client.features.lookup([{PIRATE}, {FOOD}, {PASTA}, {ITALY}], model=MODEL)
        dinner = goodfire.Variant(MODEL)
        # the Italian features at 30 and 10 (millm's strengths), once the food feature reads 15
        steer = {{f[{PASTA}]: 30 / {pasta}, f[{ITALY}]: 10 / {italy}}}
        dinner.set_when(f[{FOOD}] > 15 / {food}, steer)
        answers = {{}}
        for question in ("Tell me about your weekend.",
                         "Tell me about your weekend. What did you have for dinner?"):
            reply = client.chat.completions.create(
                [{{"role": "user", "content": question}}], model=dinner,
                max_completion_tokens=40, temperature=0, system_prompt="",
            )
            answers[question] = reply.choices[0].message["content"]
        stop = goodfire.Variant(MODEL)
        stop.abort_when(f[{PIRATE}] > 0.5)
        aborted = []
        for stream in (False, True):
            try:
                reply = client.chat.completions.create(
                    [{{"role": "user", "content": "Tell me about pirates."}}], model=stop,
                    max_completion_tokens=30, temperature=0, stream=stream,
                )
                list(reply) if stream else reply
            except goodfire.InferenceAbortedException:
                aborted.append(stream)
        calm = client.chat.completions.create(
            [{{"role": "user", "content": "What is two plus two?"}}], model=stop,
            max_completion_tokens=12, temperature=0,
        )
        emit({{"answers": answers, "aborted": aborted,
               "calm": calm.choices[0].finish_reason, "events": calm.gf_event_names}})
        """,
    )
    weekend, dinner = got["answers"].values()
    assert topical(weekend, ITALIAN_WORDS) == 0, weekend
    assert topical(dinner, ITALIAN_WORDS) > 0, dinner
    assert got["aborted"] == [False, True]
    assert got["calm"] in ("length", "stop") and got["events"] is None


def test_autosteer_finds_an_edit_that_steers_and_autoconditional_a_condition(demo_server):
    got = sdk(
        demo_server,
        """
        edits = client.features.AutoSteer(specification="talk like a pirate", model=MODEL)
        variant = goodfire.Variant(MODEL)
        variant.set(edits)
        ask = [{"role": "user", "content": "Tell me about your weekend."}]
        answers = [
            client.chat.completions.create(
                ask, model=model, max_completion_tokens=60, temperature=0, system_prompt=""
            ).choices[0].message["content"]
            for model in (MODEL, variant)
        ]
        condition = client.features.AutoConditional("pirates", model=MODEL)[0]
        emit({
            "edits": [[f.index_in_sae, f.label, value] for f, value in edits.as_dict().items()],
            "answers": answers,
            "condition": [condition.left_hand[0].index_in_sae, condition.operator,
                          condition.right_hand],
        })
        """,
    )
    ((index, label, value),) = got["edits"]
    # the edit is AutoSteer's best setting, its strength in the feature's units
    jobs = httpx.get(f"{demo_server.base_url}/api/jobs", timeout=30).json()["data"]
    job = max((j for j in jobs if j["kind"] == "autosteer"), key=lambda j: j["created_at"])
    best = job["result"]["best"]
    assert "pirate" in label and index == best["index"]
    assert value * peak(demo_server, index) == pytest.approx(best["strength"], rel=1e-6)
    plain, steered = got["answers"]
    assert steered != plain
    first = millm(demo_server, f"/api/saes/{SAE}/features", q="pirates", limit=1)["data"][0]
    feature, operator, level = got["condition"]
    p50 = millm(demo_server, f"/api/saes/{SAE}/features/{feature}", k=1)["calibration"]["p50"]
    assert (feature, operator) == (first["index"], ">")
    # the median firing level, in the feature's units (p50 is rounded in the feature's figures)
    assert level == pytest.approx(p50 / peak(demo_server, feature), rel=1e-3)


def test_inspect_tokenize_logits_and_logit_attribution(demo_server):
    got = sdk(
        demo_server,
        """
        from goodfire.api.utils import AsyncHTTPWrapper
        from goodfire.utils.asyncio import run_async_safely
        chat = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is Paris."}]
        tokens = run_async_safely(client.features._async_client._tokenize(chat, MODEL))
        context = client.features.inspect(chat, model=MODEL)
        paris = tokens.index(" Paris")
        logits = client.chat.logits(chat[:1], model=MODEL, top_k=5)
        pirate = client.features.lookup([1403], model=MODEL)[1403]
        variant = goodfire.Variant(MODEL)
        variant.set(pirate, 1.5)
        steered = client.chat.logits(chat[:1], model=variant, top_k=5)
        # A graph on two busy cores can take longer than the 10 s this SDK call waits.
        AsyncHTTPWrapper.post.__defaults__ = (None, None, 0, 120)
        graph = client.features.attribute(chat, paris, MODEL)
        emit({
            "tokens": tokens,
            "inspected": [t._token for t in context.tokens],
            "top_at_paris": [a.feature.index_in_sae for a in context.tokens[paris].inspect(k=5)],
            "top": len(context.top(k=5)),
            "matrix": list(context.matrix().shape),
            "logits": logits.logits,
            "steered": steered.logits,
            "attribution": [[a.feature_id, a.value, [t.index for t in a.token_activations]]
                            for a in graph.features],
            "inputs": graph.num_input_tokens,
            "paris": paris,
        })
        """,
    )
    assert got["tokens"] == got["inspected"] and got["tokens"][-2:] == [" Paris", "."]
    assert got["top"] == 5 and got["matrix"] == [len(got["tokens"]), 65536]
    assert 6 in got["top_at_paris"]  # "Paris / York / Japan"
    assert len(got["logits"]) == 5 and got["logits"] != got["steered"]
    assert sum(math.exp(v) for v in got["logits"].values()) <= 1.0 + 1e-6  # log-probabilities
    assert got["inputs"] == got["paris"] and got["attribution"]
    for feature_id, _, positions in got["attribution"]:
        assert feature_id.startswith("26274363-0f92-8000-8000-")
        assert positions and max(positions) < got["paris"]
    values = [value for _, value, _ in got["attribution"]]
    assert values == sorted(values, reverse=True) and values[0] > 0


def test_what_millm_cannot_honour_is_an_error_the_sdk_raises(demo_server):
    got = sdk(
        demo_server,
        """
        from goodfire.api.exceptions import InvalidRequestException, NotFoundException
        from goodfire.features.features import Feature
        raised = {}
        stranger = Feature("00000000-0000-8000-8000-000000000007", "elsewhere", 7)
        elsewhere = goodfire.Variant(MODEL)
        elsewhere.set(stranger, 0.5)
        hello = [{"role": "user", "content": "hi"}]
        calls = {
            "model": lambda: client.features.search("pirate", model="no-such-model"),
            "sae": lambda: client.chat.completions.create(
                hello, model=elsewhere, max_completion_tokens=2),
            "dataset": lambda: client.features.generate_contrastive_stimulus("be funny"),
            "vocabulary": lambda: client.chat.logits(
                hello, model=MODEL, filter_vocabulary=[" yes"]),
        }
        for name, call in calls.items():
            try:
                call()
                raised[name] = None
            except (InvalidRequestException, NotFoundException) as error:
                raised[name] = [type(error).__name__, str(error)]
        emit(raised)
        """,
    )
    assert got["model"][0] == "InvalidRequestException" and "no-such-model" in got["model"][1]
    assert got["sae"][0] == "NotFoundException" and "sae_000000000000" in got["sae"][1]
    assert got["dataset"][0] == "InvalidRequestException" and "contrast" in got["dataset"][1]
    assert got["vocabulary"][0] == "InvalidRequestException"
    assert "filter_vocabulary" in got["vocabulary"][1]
