"""POST /api/compare on a live server (tiny Llama in float32, a tiny SAE attached, live values,
profiles and a cluster): each variant's text and usage equal a single /v1/chat/completions
request with the same steering and seed (greedy and seeded sampling); the stream reassembles to
the whole answer; the default variants; one seed for every variant; a disconnect cancels the job;
every refusal."""

from __future__ import annotations

import time

import httpx
import pytest

from millm.errors import InvalidRequest
from millm.lab.compare.protocol import CompareRequest
from millm.v1.serving.prechecks import check_rows
from tests.api.clients import MODEL, api, error, post, sse_events
from tests.support.mistudio_docs import cluster, raw
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

MESSAGES = [{"role": "user", "content": "Tell me about your weekend."}]
LAYER = 1
LIVE = {3: 8.0}
PROFILE = {5: 30.0, 17: -12.0}
FEATURES = [{"index": 11, "strength": 25.0}, {"index": 20, "strength": -15.0}]
CLUSTER = "river-cluster"


def profile_body(name: str, sae: str, features: list[dict]) -> dict:
    return {"name": name, "steering": [{"sae_id": sae, "layer": LAYER, "features": features}]}


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("compare-home"),
        ["--model", str(tiny_dirs["llama"]), "--dtype", "float32"],
    )
    try:
        process.wait_ready()
        sae_dir = build_saelens(tmp_path_factory.mktemp("compare-sae") / "sae", layer=LAYER, seed=7)
        sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{sae}/attach", {}).status_code == 200
        for index, strength in LIVE.items():
            assert (
                api(
                    process,
                    "PUT",
                    f"/api/steering/saes/{sae}/features/{index}",
                    json={"strength": strength},
                ).status_code
                == 200
            )
        profile = [{"index": i, "strength": s} for i, s in PROFILE.items()]
        assert (
            post(process, "/api/profiles", profile_body("tiny-profile", sae, profile)).status_code
            == 201
        )
        # The features variant's twin: a request-scoped profile with the same strengths.
        assert (
            post(process, "/api/profiles", profile_body("features-twin", sae, FEATURES)).status_code
            == 201
        )
        imported = api(
            process,
            "POST",
            "/api/clusters/import",
            content=raw(cluster(name=CLUSTER)),
            headers={"content-type": "application/json"},
        )
        assert imported.status_code == 201, imported.text
        process.sae = sae
        yield process
    finally:
        process.stop()


def compare(server, body: dict, **kwargs) -> httpx.Response:
    return post(server, "/api/compare", {"messages": MESSAGES, **body}, **kwargs)


def compared(server, body: dict) -> dict:
    response = compare(server, body)
    assert response.status_code == 200, response.text
    return response.json()


def single(server, sampling: dict, **steering) -> dict:
    response = post(
        server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": MESSAGES, **sampling, **steering},
    )
    assert response.status_code == 200, response.text
    return response.json()


# Each variant beside the single /v1 request with the same steering.
VARIANTS = [
    ("unsteered", {"steering_intensity": 0}),
    ("live", {}),
    ({"profile": "tiny-profile"}, {"profile": "tiny-profile"}),
    ({"features": FEATURES}, {"profile": "features-twin"}),
    (
        {"profile": "tiny-profile", "intensity": 0.5, "label": "half"},
        {"profile": "tiny-profile", "steering_intensity": 0.5},
    ),
    ({"live": True, "intensity": "max"}, {"steering_intensity": "max"}),
]


def counts(usage: dict) -> dict:
    """A usage's token counts, without what the prefix cache held."""
    return {key: usage[key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")}


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0, "max_tokens": 16}, {"temperature": 1.0, "seed": 1234, "max_tokens": 16}],
    ids=["greedy", "seeded"],
)
def test_each_variant_equals_a_single_request_with_its_steering(server, sampling):
    answer = compared(server, {**sampling, "variants": [variant for variant, _ in VARIANTS]})
    assert (
        answer["object"] == "compare"
        and answer["model"] == MODEL
        and answer["id"].startswith("cmp-")
    )
    assert [v["index"] for v in answer["variants"]] == list(range(len(VARIANTS)))
    prompt_tokens = None
    for got, (_, steering) in zip(answer["variants"], VARIANTS, strict=True):
        alone = single(server, sampling, **steering)
        choice = alone["choices"][0]
        assert got["text"] == choice["message"]["content"], got["label"]
        assert got["finish_reason"] == choice["finish_reason"]
        # cached_tokens: whichever ran first warmed the prefix cache
        assert counts(got["usage"]) == counts(alone["usage"])
        prompt_tokens = alone["usage"]["prompt_tokens"]
    texts = [v["text"] for v in answer["variants"]]
    assert texts[2] != texts[0] and texts[3] != texts[0]  # the steering really changes the answer
    completion = sum(v["usage"]["completion_tokens"] for v in answer["variants"])
    assert counts(answer["usage"]) == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }
    assert 0 <= answer["usage"]["prompt_tokens_details"]["cached_tokens"] < prompt_tokens
    if "seed" in sampling:
        assert answer["seed"] == sampling["seed"]
        assert (
            compared(server, {**sampling, "variants": [variant for variant, _ in VARIANTS]})[
                "variants"
            ]
            == answer["variants"]
        )


def test_the_answer_says_what_steered_each_variant(server):
    answer = compared(
        server,
        {"temperature": 0, "max_tokens": 2, "variants": [variant for variant, _ in VARIANTS]},
    )
    steering = [v["steering"] for v in answer["variants"]]
    assert steering[0] == {"kind": "none", "params": {}}
    assert steering[1]["kind"] == "live" and "version" in steering[1]["params"]
    assert steering[2] == {
        "kind": "profile",
        "name": "tiny-profile",
        "params": {"scope": "request"},
    }
    assert steering[3] == {
        "kind": "features",
        "params": {"scope": "request"},
        "features": [{"sae_id": server.sae, **feature} for feature in FEATURES],
    }
    assert steering[4]["intensity"] == 0.5 and steering[5]["intensity"] == 2.0
    labels = [v["label"] for v in answer["variants"]]
    assert labels == [
        "unsteered",
        "live",
        "tiny-profile",
        "features 11:+25, 20:-15",
        "half",
        "live @ max",
    ]


def test_a_cluster_variant_equals_the_cluster_made_active(server):
    sampling = {"temperature": 0, "max_tokens": 12}
    answer = compared(
        server,
        {
            **sampling,
            "variants": ["unsteered", {"cluster": CLUSTER}, {"cluster": CLUSTER, "intensity": 0.5}],
        },
    )
    assert api(server, "POST", f"/api/clusters/{CLUSTER}/activate").status_code == 200
    try:
        stored = single(server, sampling)["choices"][0]["message"]["content"]
        dialled = single(server, sampling, steering_intensity=0.5)["choices"][0]["message"][
            "content"
        ]
    finally:
        assert api(server, "POST", "/api/clusters/deactivate").status_code == 200
    texts = [v["text"] for v in answer["variants"]]
    assert texts[1:] == [stored, dialled] and texts[1] != texts[0]
    assert (
        answer["variants"][2]["steering"]["kind"] == "cluster"
        and answer["variants"][2]["steering"]["intensity"] == 0.5
    )


def test_the_stream_reassembles_to_the_whole_answer(server):
    body = {
        "temperature": 1.0,
        "seed": 99,
        "max_tokens": 12,
        "variants": ["unsteered", {"features": FEATURES}, "live"],
    }
    whole = compared(server, body)
    response = compare(server, {**body, "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/event-stream"
    )
    assert response.headers["x-millm-seed"] == '99;scope="batch-shape"'
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    start, *middle, totals = events[:-1]
    assert start["object"] == "compare.start" and start["seed"] == 99 and start["model"] == MODEL
    assert start["variants"] == [
        {k: v[k] for k in ("index", "label", "steering")} for v in whole["variants"]
    ]
    texts = ["", "", ""]
    finished = {}
    for event in middle:
        if event["object"] == "compare.delta":
            assert event["variant"] not in finished  # no text after a variant's finish event
            texts[event["variant"]] += event["delta"]
        else:
            assert event["object"] == "compare.finish"
            finished[event["variant"]] = event
    assert texts == [v["text"] for v in whole["variants"]]
    assert sorted(finished) == [0, 1, 2]
    for variant in whole["variants"]:
        assert finished[variant["index"]]["usage"] == variant["usage"]
        assert finished[variant["index"]]["finish_reason"] == variant["finish_reason"]
    assert totals == {"object": "compare.usage", "usage": whole["usage"]}


def test_default_variants_are_unsteered_and_live(server):
    for body in ({}, {"variants": None}):
        answer = compared(server, {"temperature": 0, "max_tokens": 8, **body})
        assert [(v["label"], v["steering"]["kind"]) for v in answer["variants"]] == [
            ("unsteered", "none"),
            ("live", "live"),
        ]
        assert (
            answer["variants"][0]["text"]
            == single(server, {"temperature": 0, "max_tokens": 8}, steering_intensity="off")[
                "choices"
            ][0]["message"]["content"]
        )


def test_every_variant_draws_from_one_seed_even_when_none_is_sent(server):
    response = compare(
        server,
        {
            "temperature": 1.0,
            "max_tokens": 16,
            "variants": ["unsteered", {"unsteered": True, "label": "again"}, "unsteered"],
        },
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    texts = [v["text"] for v in answer["variants"]]
    assert texts[0] == texts[1] == texts[2] and [v["label"] for v in answer["variants"]] == [
        "unsteered",
        "again",
        "unsteered",
    ]
    seed = answer["seed"]
    assert response.headers["x-millm-seed"] == f'{seed};scope="batch-shape"'
    assert response.headers["x-millm-steering"] == "compare;variants=3"
    again = compared(
        server, {"temperature": 1.0, "max_tokens": 16, "seed": seed, "variants": ["unsteered"]}
    )
    assert again["variants"][0]["text"] == texts[0]


def test_a_client_that_leaves_cancels_the_comparison(server):
    def cancelled() -> int:
        return api(server, "GET", "/api/health/inference").json()["jobs"]["serial"]["cancelled"]

    before = cancelled()
    body = {
        "messages": MESSAGES,
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
        "variants": ["unsteered", "live"],
    }
    with httpx.stream("POST", f"{server.base_url}/api/compare", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    deadline = time.monotonic() + 30
    while cancelled() != before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cancelled() == before + 1
    assert api(server, "GET", "/api/health/inference").json()["running_rows"] == 0


REFUSALS = [
    # (body, status, code, param)
    ({"variants": [{"profile": "nope"}]}, 404, "profile_not_found", "variants[0].profile"),
    (
        {"variants": ["unsteered", {"cluster": "nope"}]},
        404,
        "cluster_not_found",
        "variants[1].cluster",
    ),
    ({"variants": [{"circuit": "nope"}]}, 404, "circuit_not_found", "variants[0].circuit"),
    (
        {"variants": [{"features": [{"index": 128, "strength": 5}]}]},
        400,
        "invalid_feature_index",
        "variants[0].features[0].index",
    ),
    (
        {"variants": [{"features": [{"sae_id": "sae_nope", "index": 1, "strength": 5}]}]},
        400,
        "sae_not_attached",
        "variants[0].features[0].sae_id",
    ),
    (
        {"variants": [{"features": [{"index": 1, "strength": 5}, {"index": 1, "strength": 6}]}]},
        400,
        "invalid_parameter",
        "variants[0].features[1]",
    ),
    (
        {"variants": [{"features": [{"index": 1, "strength": 250}]}]},
        400,
        "invalid_parameter",
        "variants[0].features[0].strength",
    ),
    (
        {"variants": [{"features": [{"index": -1, "strength": 1}]}]},
        400,
        "invalid_parameter",
        "variants[0].features[0].index",
    ),
    ({"variants": [{"features": []}]}, 400, "invalid_parameter", "variants[0].features"),
    ({"variants": ["unsteered"] * 9}, 400, "invalid_parameter", "variants"),
    ({"variants": []}, 400, "invalid_parameter", "variants"),
    ({"variants": "unsteered"}, 400, "invalid_parameter", "variants"),
    ({"variants": ["pirate"]}, 400, "invalid_parameter", "variants[0]"),
    ({"variants": [3]}, 400, "invalid_parameter", "variants[0]"),
    ({"variants": [{"profile": 3}]}, 400, "invalid_parameter", "variants[0].profile"),
    (
        {"variants": [{"profile": "tiny-profile", "features": FEATURES}]},
        400,
        "invalid_parameter",
        "variants[0]",
    ),
    ({"variants": [{"label": "nothing"}]}, 400, "invalid_parameter", "variants[0]"),
    ({"variants": [{"unsteered": False}]}, 400, "invalid_parameter", "variants[0].unsteered"),
    ({"variants": [{"unsteered": True, "intensity": 1}]}, 400, "invalid_parameter", "variants[0]"),
    (
        {"variants": [{"profile": "tiny-profile", "intensity": 3}]},
        400,
        "invalid_parameter",
        "variants[0].intensity",
    ),
    (
        {"variants": [{"profile": "tiny-profile", "weight": 1}]},
        400,
        "invalid_parameter",
        "variants[0].weight",
    ),
    ({"n": 2}, 400, "invalid_parameter", "n"),
    ({"temperature": "0"}, 400, "invalid_parameter", "temperature"),
    ({"max_tokens": 5000}, 400, "context_length_exceeded", "messages"),
    ({"model": "other-model"}, 404, "model_not_found", "model"),
]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"), REFUSALS, ids=[str(i) for i in range(len(REFUSALS))]
)
def test_refusals_name_the_variant(server, body, status, code, param):
    got = error(compare(server, body), status, code)
    assert got["param"] == param, got


def test_refusals_outside_the_variants(server):
    # no messages
    error(post(server, "/api/compare", {"variants": ["unsteered"]}), 400, "invalid_parameter")
    strict = compare(
        server,
        {"max_tokens": 2, "messages": [{"role": "user", "content": "hi", "weight": 2}]},
        headers={"X-miLLM-Strict": "true"},
    )
    assert error(strict, 400, "unused_fields_refused")["param"] == "messages[0].weight"
    lenient = compare(
        server, {"max_tokens": 2, "messages": [{"role": "user", "content": "hi", "weight": 2}]}
    )
    assert (
        lenient.status_code == 200
        and lenient.headers["x-millm-ignored-fields"] == '"messages[0].weight"'
    )


def test_the_variants_count_against_the_row_bound():
    body = CompareRequest.model_validate(
        {"messages": MESSAGES, "variants": ["unsteered", "live", "unsteered"]}
    )
    check_rows(body, 3)
    with pytest.raises(InvalidRequest) as refused:
        check_rows(body, 2)
    assert refused.value.param == "variants" and "3 rows (3 variants" in refused.value.message
