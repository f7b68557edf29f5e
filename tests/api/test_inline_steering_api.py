"""The original miLLM's inline steering shape (`steering: {"sae_id"?, "features": [{"index",
"strength"}]}`) beside millm's own, and X-miLLM-Steering in the original's grammar: members with
the applied set's size and canonical hash, `clamped`, the stream's last chunk, and the refusals of
the inline shape, on a live server with two SAEs on two layers."""

from __future__ import annotations

import json

import pytest

from millm.interp.steering_hash import steering_set_hash
from tests.api.clients import MODEL, answer_events, api, error, sse_events
from tests.support.server import ServerProcess
from tests.support.steering_header import member, members
from tests.support.tiny_saes import build_saelens

USER = [{"role": "user", "content": "Tell me about the city."}]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    base = tmp_path_factory.mktemp("inline-saes")
    process = ServerProcess(
        tmp_path_factory.mktemp("inline-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        process.wait_ready()
        for key, layer in (("a", 1), ("b", 2)):
            path = build_saelens(base / key, layer=layer, seed=20 + layer)
            sae = api(process, "POST", "/api/saes", json={"path": str(path)}).json()["id"]
            api(process, "POST", f"/api/saes/{sae}/attach")
        yield process
    finally:
        process.stop()


@pytest.fixture
def ids(server):
    api(server, "DELETE", "/api/steering/features")
    api(server, "POST", "/api/profiles/deactivate")
    listed = {s["layer"]: s["id"] for s in api(server, "GET", "/api/saes").json()["data"]}
    return listed[1], listed[2]


def chat(server, **extra):
    body = {"model": MODEL, "messages": USER, "max_tokens": 12, "temperature": 0, **extra}
    return api(server, "POST", "/v1/chat/completions", json=body)


def text(response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_an_inline_set_is_named_with_its_layer_count_and_hash(server, ids):
    a, _ = ids
    plain = chat(server)
    steered = chat(server, steering={"sae_id": a, "features": [{"index": 7, "strength": 40}]})
    assert text(steered) != text(plain)
    assert steered.headers["x-millm-steering"] == (
        f'inline;sae="{a}";layer=1;features=1;hash="{steering_set_hash(a, [(7, 40.0)])}"'
    )
    # millm's own shape with the same features is the same request
    own = chat(
        server,
        steering={"steering": [{"sae_id": a, "features": [{"index": 7, "strength": 40}]}]},
    )
    assert text(own) == text(steered)
    assert own.headers["x-millm-steering"] == steered.headers["x-millm-steering"]


def test_a_strength_past_the_limit_is_applied_at_200_and_counted(server, ids):
    a, _ = ids
    over = chat(server, steering={"sae_id": a, "features": [{"index": 7, "strength": 500}]})
    at_limit = chat(server, steering={"sae_id": a, "features": [{"index": 7, "strength": 200}]})
    assert text(over) == text(at_limit)
    kind, params = member(over.headers["x-millm-steering"])
    assert kind == "inline" and params["clamped"] == 1
    assert params["hash"] == steering_set_hash(a, [(7, 200.0)])
    assert "clamped" not in member(at_limit.headers["x-millm-steering"])[1]


def test_an_inline_set_and_a_profile_of_the_same_features_differ_only_in_kind(server, ids):
    a, _ = ids
    features = [{"index": 3, "strength": 30.0}, {"index": 9, "strength": -12.5}]
    api(
        server,
        "POST",
        "/api/profiles",
        json={"name": "same-set", "steering": [{"sae_id": a, "features": features}]},
    )
    try:
        inline = chat(server, steering={"sae_id": a, "features": features})
        saved = chat(server, profile="same-set")
        assert text(inline) == text(saved)
        (kind_i, inline_p), (kind_p, profile_p) = (
            member(r.headers["x-millm-steering"]) for r in (inline, saved)
        )
        assert (kind_i, kind_p) == ("inline", "profile")
        assert inline_p["features"] == profile_p["features"] == 2
        assert (
            inline_p["hash"] == profile_p["hash"] == steering_set_hash(a, [(3, 30.0), (9, -12.5)])
        )
        assert (profile_p["name"], profile_p["source"], profile_p["intensity"]) == (
            "same-set",
            "request",
            "1.0",
        )
    finally:
        api(server, "DELETE", "/api/profiles/same-set")


def test_an_empty_inline_set_is_the_unsteered_model_for_that_request_only(server, ids):
    a, b = ids
    plain = text(chat(server))
    api(
        server,
        "POST",
        "/api/profiles",
        json={
            "name": "both-layers",
            "steering": [
                {"sae_id": a, "features": [{"index": 1, "strength": 50}]},
                {"sae_id": b, "features": [{"index": 2, "strength": 50}]},
            ],
        },
    )
    api(server, "POST", "/api/profiles/both-layers/activate")
    try:
        steered = chat(server)
        # one member per SAE, by layer, each saying the active profile steered it
        assert [
            (k, p["sae"], p["layer"], p["source"])
            for k, p in members(steered.headers["x-millm-steering"])
        ] == [
            ("profile", a, 1, "active"),
            ("profile", b, 2, "active"),
        ]
        unsteered = chat(server, steering={"features": []})
        assert text(unsteered) == plain != text(steered)
        assert unsteered.headers["x-millm-steering"] == "none"
        assert text(chat(server)) == text(steered)  # the next request is steered again
    finally:
        api(server, "POST", "/api/profiles/deactivate")
        api(server, "DELETE", "/api/profiles/both-layers")


def test_the_inline_shape_names_its_sae_unless_one_is_attached(server, ids):
    a, b = ids
    refused = error(chat(server, steering={"features": [{"index": 7, "strength": 40}]}), 400)
    assert f"{a} at layer 1" in refused["message"] and f"{b} at layer 2" in refused["message"]
    api(server, "POST", f"/api/saes/{b}/detach")
    try:
        only = chat(server, steering={"features": [{"index": 7, "strength": 40}]})
        named = chat(server, steering={"sae_id": a, "features": [{"index": 7, "strength": 40}]})
        assert text(only) == text(named)
        assert only.headers["x-millm-steering"] == named.headers["x-millm-steering"]
    finally:
        api(server, "POST", f"/api/saes/{b}/attach")


@pytest.mark.parametrize(
    ("steering", "extra", "param", "code"),
    [
        ({"features": [{"index": 1, "strength": True}]}, {}, "steering.features[0].strength", None),
        (
            {"features": [{"index": 1, "strength": 2}, {"index": 1, "strength": 3}]},
            {},
            "steering.features[1].index",
            None,
        ),
        ({"sae_id": "SAE", "features": []}, {}, "steering.sae_id", None),
        ({"features": [{"index": -1, "strength": 2}]}, {}, "steering.features[0].index", None),
        ({"features": [{"index": 1, "strength": 2}], "extra": 1}, {}, "steering.extra", None),
        ({"features": [{"index": 1, "strength": 2}]}, {"profile": "anything"}, "steering", None),
        (
            {"features": [{"index": 1, "strength": 2}]},
            {"steering_intensity": 1.5},
            "steering_intensity",
            None,
        ),
        (
            {"sae_id": "sae_000000000000", "features": [{"index": 1, "strength": 2}]},
            {},
            "steering",
            "sae_not_attached",
        ),
        (
            {"sae_id": "SAE", "features": [{"index": 128, "strength": 2}]},
            {},
            "steering",
            "invalid_feature_index",
        ),
    ],
    ids=[
        "boolean",
        "twice",
        "sae-without-features",
        "negative",
        "unknown-key",
        "with-profile",
        "with-dial",
        "unattached",
        "past-width",
    ],
)
def test_the_inline_shape_is_refused_before_it_steers(server, ids, steering, extra, param, code):
    a, _ = ids
    if steering.get("sae_id") == "SAE":
        steering = {**steering, "sae_id": a}
    before = api(server, "GET", "/api/steering").json()
    body = error(chat(server, steering=steering, **extra), 400, code)
    assert body["param"] == param
    assert api(server, "GET", "/api/steering").json() == before


def test_a_non_finite_strength_is_refused(server, ids):
    a, _ = ids
    body = {"model": MODEL, "messages": USER, "steering": {"sae_id": a, "features": []}}
    # JSON has no NaN, but Python's reader takes one: it must not reach the engine
    raw = json.dumps(body).replace('"features": []', '"features": [{"index": 1, "strength": NaN}]')
    response = api(
        server,
        "POST",
        "/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert error(response, 400)["param"] == "steering.features[0].strength"


def test_text_completions_take_the_inline_shape_and_a_stream_ends_saying_what_steered(server, ids):
    a, _ = ids
    body = {
        "model": MODEL,
        "prompt": "The city",
        "max_tokens": 8,
        "temperature": 0,
        "steering": {"sae_id": a, "features": [{"index": 7, "strength": 40}]},
    }
    whole = api(server, "POST", "/v1/completions", json=body)
    streamed = api(server, "POST", "/v1/completions", json={**body, "stream": True})
    assert "x-millm-steering" not in streamed.headers
    events = sse_events(streamed.text)
    said = events[-2]
    assert said["object"] == "text_completion" and said["choices"] == [] and said["created"] == 0
    assert said["millm_steering"] == whole.headers["x-millm-steering"]
    assert member(said["millm_steering"])[0] == "inline"
    joined = "".join(e["choices"][0]["text"] for e in answer_events(events)[:-1] if e["choices"])
    assert joined == whole.json()["choices"][0]["text"]
    # the dial on a text completion scales the active base, as on chat
    plain = api(server, "POST", "/v1/completions", json={**body, "steering": None})
    dialled = api(
        server,
        "POST",
        "/v1/completions",
        json={**body, "steering": None, "steering_intensity": 0.5},
    )
    assert dialled.status_code == 200 and dialled.headers["x-millm-steering"] == "none"
    assert dialled.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
