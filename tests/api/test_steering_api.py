"""/api/steering and per-request profiles on a live server: the state, its rules, and what
requests see."""

import json
import threading

import httpx
import pytest

from millm.interp.steering_hash import steering_set_hash
from tests.api.clients import MODEL, api, error, sdk
from tests.support.model_dirs import endless
from tests.support.server import ServerProcess
from tests.support.steering_header import member, members
from tests.support.tiny_saes import build_saelens

USER = [{"role": "user", "content": "Tell me about the city."}]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("steer-home")


@pytest.fixture(scope="module")
def saes(tmp_path_factory):
    base = tmp_path_factory.mktemp("steer-saes")
    return {
        "a": build_saelens(base / "a", layer=1, seed=11),
        "b": build_saelens(base / "b", layer=2, architecture="standard", seed=12),
    }


@pytest.fixture(scope="module")
def server(tiny_dirs, home, saes, tmp_path_factory):
    # without an end-of-sequence token every answer runs to max_tokens: a long stream is long
    model = endless(tiny_dirs["llama"], tmp_path_factory.mktemp("endless") / MODEL)
    process = ServerProcess(home, ["--model", str(model)])
    try:
        process.wait_ready()
        for key in ("a", "b"):
            sae = api(process, "POST", "/api/saes", json={"path": str(saes[key])}).json()["id"]
            api(process, "POST", f"/api/saes/{sae}/attach")
        yield process
    finally:
        process.stop()


@pytest.fixture
def ids(server):
    listed = {s["layer"]: s["id"] for s in api(server, "GET", "/api/saes").json()["data"]}
    api(server, "DELETE", "/api/steering/features")
    api(server, "POST", "/api/steering/enable")
    api(server, "POST", "/api/profiles/deactivate")
    return listed[1], listed[2]


def greedy(server, **extra):
    response = api(
        server,
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 12, "temperature": 0, **extra},
    )
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], response.headers["x-millm-steering"]


def test_set_one_many_clear_and_versions(server, ids):
    a, b = ids
    v0 = api(server, "GET", "/api/steering").json()["version"]
    one = api(server, "PUT", f"/api/steering/saes/{a}/features/3", json={"strength": 12.5}).json()
    assert one["live"] is True and one["steering"]["version"] == v0 + 1
    many = api(
        server,
        "POST",
        "/api/steering/features",
        json={
            "features": [
                {"sae_id": a, "index": 4, "strength": -3},
                {"sae_id": b, "index": 7, "strength": 8},
            ]
        },
    ).json()
    state = {
        s["sae_id"]: {f["index"]: f["strength"] for f in s["features"]}
        for s in many["steering"]["saes"]
    }
    assert state == {a: {3: 12.5, 4: -3.0}, b: {7: 8.0}}
    cleared = api(server, "DELETE", f"/api/steering/saes/{a}/features/3").json()
    assert {
        f["index"] for s in cleared["steering"]["saes"] if s["sae_id"] == a for f in s["features"]
    } == {4}
    replaced = api(
        server,
        "POST",
        "/api/steering/features",
        json={"features": [{"sae_id": b, "index": 1, "strength": 2}], "replace": True},
    ).json()
    assert [
        (s["sae_id"], s["features"]) for s in replaced["steering"]["saes"] if s["features"]
    ] == [(b, [{"index": 1, "op": "add", "strength": 2.0}])]
    empty = api(server, "DELETE", "/api/steering/features").json()
    assert all(not s["features"] for s in empty["steering"]["saes"])
    assert empty["steering"]["version"] == v0 + 5


def test_limits_are_refused_and_nothing_changes(server, ids):
    a, _ = ids
    before = api(server, "GET", "/api/steering").json()
    body = error(
        api(server, "PUT", f"/api/steering/saes/{a}/features/3", json={"strength": 200.5}), 400
    )
    assert "±200" in body["message"]
    body = error(
        api(server, "PUT", f"/api/steering/saes/{a}/features/128", json={"strength": 1}),
        400,
        "invalid_feature_index",
    )
    assert "128 features" in body["message"]
    error(
        api(
            server,
            "POST",
            "/api/steering/features",
            json={
                "features": [
                    {"sae_id": a, "index": 1, "strength": 1},
                    {"sae_id": a, "index": 500, "strength": 1},
                ]
            },
        ),
        400,
        "invalid_feature_index",
    )
    error(
        api(server, "PUT", "/api/steering/saes/sae_nope/features/1", json={"strength": 1}),
        404,
        "sae_not_found",
    )
    error(api(server, "PUT", f"/api/steering/saes/{a}/features/1", json={"strength": "3"}), 400)
    assert api(server, "GET", "/api/steering").json() == before


def test_steering_changes_output_and_headers_say_so(server, ids):
    a, _ = ids
    plain, header = greedy(server)
    assert header == "none"
    response = api(server, "PUT", f"/api/steering/saes/{a}/features/0", json={"strength": 60})
    version = response.json()["steering"]["version"]
    steered, header = greedy(server)
    assert steered != plain
    assert member(header) == (
        "manual",
        {
            "sae": a,
            "layer": 1,
            "features": 1,
            "hash": steering_set_hash(a, [(0, 60.0)]),
            "version": version,
        },
    )
    api(server, "POST", "/api/steering/disable")
    off, header = greedy(server)
    assert off == plain and header == "none"
    enabled = api(server, "POST", "/api/steering/enable").json()
    assert enabled["live"] is True
    assert greedy(server)[0] == steered
    api(server, "PUT", f"/api/steering/saes/{a}/features/0", json={"strength": 0})
    assert greedy(server)[0] == plain


def test_change_on_a_detached_sae_is_stored_but_not_live(server, ids):
    a, _ = ids
    api(server, "POST", f"/api/saes/{a}/detach")
    try:
        response = api(
            server, "PUT", f"/api/steering/saes/{a}/features/5", json={"strength": 9}
        ).json()
        assert response["live"] is False and "not attached" in response["reason"]
    finally:
        api(server, "POST", f"/api/saes/{a}/attach")


def profile_doc(name, sae, index=0, strength=60.0, layer=None):
    entry = {"sae_id": sae, "features": [{"index": index, "strength": strength}]}
    if layer is not None:
        entry["layer"] = layer
    return {"name": name, "description": "test", "steering": [entry]}


def test_per_request_profile(server, ids):
    a, _ = ids
    plain, _ = greedy(server)
    api(server, "PUT", f"/api/steering/saes/{a}/features/0", json={"strength": 60})
    live_steered, _ = greedy(server)
    api(server, "DELETE", "/api/steering/features")
    created = api(server, "POST", "/api/profiles", json=profile_doc("loud", a, layer=1))
    assert created.status_code == 201
    text, header = greedy(server, profile="loud")
    assert text == live_steered
    assert member(header) == (
        "profile",
        {
            "name": "loud",
            "source": "request",
            "intensity": "1.0",
            "sae": a,
            "layer": 1,
            "features": 1,
            "hash": steering_set_hash(a, [(0, 60.0)]),
        },
    )
    assert greedy(server, profile=created.json()["id"])[0] == live_steered
    assert greedy(server)[0] == plain  # nothing global changed
    body = error(
        api(
            server,
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": USER, "profile": "ghost"},
        ),
        404,
        "profile_not_found",
    )
    assert "ghost" in body["message"]
    api(server, "POST", "/api/profiles", json=profile_doc("too-wide", a, index=127))
    api(
        server,
        "PUT",
        "/api/profiles/too-wide",
        json={"steering": [{"sae_id": a, "features": [{"index": 127, "strength": 1}]}]},
    )
    api(server, "POST", "/api/profiles", json=profile_doc("wrong-layer", a, layer=2))
    error(
        api(
            server,
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": USER, "profile": "wrong-layer"},
        ),
        400,
        "profile_not_applicable",
    )
    api(server, "POST", "/api/profiles", json=profile_doc("other-sae", "sae_000000000000"))
    error(
        api(
            server,
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": USER, "profile": "other-sae"},
        ),
        400,
        "profile_not_applicable",
    )
    # Text completions take a profile too (as the original miLLM's do); scoring never is steered.
    completion = {"model": MODEL, "prompt": "x", "max_tokens": 8, "temperature": 0}
    plain_text = api(server, "POST", "/v1/completions", json=completion)
    loud_text = api(server, "POST", "/v1/completions", json={**completion, "profile": "loud"})
    assert loud_text.json()["choices"][0]["text"] != plain_text.json()["choices"][0]["text"]
    assert member(loud_text.headers["x-millm-steering"])[1]["source"] == "request"
    error(
        api(
            server,
            "POST",
            "/v1/completions",
            json={**completion, "max_tokens": 1, "logprobs": 2, "profile": "loud"},
        ),
        400,
        "field_not_honoured",
    )


def test_operator_change_during_a_profile_request_stays_live(server, ids):
    """Two clients: one streams with a profile while the operator changes the live values."""
    a, _ = ids
    api(
        server, "POST", "/api/profiles", json=profile_doc("stream-profile", a, index=2, strength=30)
    )
    started = threading.Event()
    chunks = []

    def stream():
        body = {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 1500,
            "temperature": 0,
            "stream": True,
            "profile": "stream-profile",
        }
        with httpx.stream(
            "POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120
        ) as response:
            headers.update(response.headers)
            for line in response.iter_lines():
                if line:
                    chunks.append(line)
                    started.set()

    headers: dict[str, str] = {}
    client = threading.Thread(target=stream)
    client.start()
    assert started.wait(60)
    change = api(server, "PUT", f"/api/steering/saes/{a}/features/9", json={"strength": 7}).json()
    client.join(120)
    assert chunks[-1] == "data: [DONE]"
    # The stream says what steered it in its last chunk, not a header: the request's profile as
    # its plan applied it, marked `changed` because the operator wrote while it ran.
    last = json.loads(chunks[-2].removeprefix("data: "))
    assert "x-millm-steering" not in headers
    assert last["choices"] == [] and last["created"] == 0
    kind, params = member(last["millm_steering"])
    assert kind == "profile" and params["name"] == "stream-profile"
    assert params["hash"] == steering_set_hash(a, [(2, 30.0)]) and params["changed"] is True
    assert sum("millm_steering" in line for line in chunks) == 1
    assert change["live"] is True
    state = api(server, "GET", "/api/steering").json()
    assert {
        f["index"]: f["strength"] for s in state["saes"] if s["sae_id"] == a for f in s["features"]
    } == {9: 7.0}
    kind, params = member(greedy(server)[1])
    assert kind == "manual" and params["version"] == change["steering"]["version"]
    assert "changed" not in params  # nothing moved while this one ran


def test_no_sae_attached_runs_a_profile_request_unsteered(server, ids):
    a, b = ids
    api(server, "POST", "/api/profiles", json=profile_doc("detached-case", a))
    plain, _ = greedy(server)
    for sae in (a, b):
        api(server, "POST", f"/api/saes/{sae}/detach")
    try:
        text, header = greedy(server, profile="detached-case")
        assert text == plain and header.startswith("none")
    finally:
        for sae in (a, b):
            api(server, "POST", f"/api/saes/{sae}/attach")


def test_embeddings_are_never_steered(server, ids):
    a, b = ids
    body = {"model": MODEL, "input": ["The cat runs", "Paris"]}
    plain = api(server, "POST", "/v1/embeddings", json=body).json()
    plain_text, _ = greedy(server)
    api(
        server,
        "POST",
        "/api/steering/features",
        json={
            "features": [
                {"sae_id": a, "index": 0, "strength": 150},
                {"sae_id": b, "index": 3, "strength": -150},
            ]
        },
    )
    assert greedy(server)[0] != plain_text  # generation is steered at both layers
    steered = api(server, "POST", "/v1/embeddings", json=body)
    assert steered.headers["x-millm-steering"] == "none"
    assert steered.json()["data"] == plain["data"]  # bit-identical floats
    base64 = api(
        server, "POST", "/v1/embeddings", json={**body, "encoding_format": "base64"}
    ).json()
    import base64 as b64
    import struct

    decoded = struct.unpack("<64f", b64.b64decode(base64["data"][0]["embedding"]))
    assert list(decoded) == plain["data"][0]["embedding"]


def test_profiles_crud_activate_export_import(server, ids):
    a, b = ids
    plain, _ = greedy(server)
    made = api(
        server,
        "POST",
        "/api/profiles",
        json={
            "name": "two-layers",
            "description": "d",
            "steering": [
                {"sae_id": a, "layer": 1, "features": [{"index": 0, "strength": 60}]},
                {"sae_id": b, "layer": 2, "features": [{"index": 3, "strength": 20}]},
            ],
        },
    ).json()
    assert made["active"] is False and made["document"]["version"] == 2
    error(
        api(server, "POST", "/api/profiles", json={"name": "two-layers", "steering": []}),
        409,
        "profile_exists",
    )
    listed = [p["name"] for p in api(server, "GET", "/api/profiles").json()["data"]]
    assert "two-layers" in listed
    activated = api(server, "POST", "/api/profiles/two-layers/activate").json()
    assert activated["live"] is True and activated["steering"]["source"] == "profile"
    text, header = greedy(server)
    assert text != plain
    assert [
        (kind, p["name"], p["source"], p["sae"], p["layer"]) for kind, p in members(header)
    ] == [
        ("profile", "two-layers", "active", a, 1),
        ("profile", "two-layers", "active", b, 2),
    ]
    changed = api(server, "PUT", "/api/profiles/two-layers", json={"description": "new"}).json()
    assert changed["document"]["description"] == "new" and changed["active"] is True
    error(
        api(
            server,
            "PUT",
            "/api/profiles/two-layers",
            json={"steering": [{"sae_id": a, "features": [{"index": 999, "strength": 1}]}]},
        ),
        400,
        "invalid_feature_index",
    )
    exported = api(server, "GET", "/api/profiles/two-layers/export").json()
    assert exported["kind"] == "millm.profile" and exported["description"] == "new"
    assert api(server, "POST", "/api/profiles/deactivate").json()["deactivated"] == made["id"]
    assert greedy(server)[0] == plain
    imported = api(
        server, "POST", "/api/profiles/import", params={"on_conflict": "rename"}, json=exported
    ).json()
    assert imported["data"][0]["name"] == "two-layers-2"
    assert imported["data"][0]["document"]["steering"] == exported["steering"]
    error(api(server, "POST", "/api/profiles/import", json=exported), 409, "profile_exists")
    deleted = api(server, "DELETE", "/api/profiles/two-layers-2").json()
    assert deleted["deleted"]
    error(api(server, "GET", "/api/profiles/two-layers-2"), 404, "profile_not_found")


def test_bad_import_is_refused_whole(server, ids):
    a, _ = ids
    before = api(server, "GET", "/api/profiles").json()["data"]
    bundle = {
        "kind": "millm.profile-bundle",
        "version": 1,
        "profiles": [
            {"name": "fine-one", "steering": []},
            {
                "name": "broken-one",
                "steering": [{"sae_id": a, "features": [{"index": 1, "strength": 900}]}],
            },
        ],
    }
    body = error(api(server, "POST", "/api/profiles/import", json=bundle), 400, "invalid_profile")
    assert "profiles[1].steering[0].features[0].strength" in body["message"]
    assert api(server, "GET", "/api/profiles").json()["data"] == before
    good = {**bundle, "profiles": [bundle["profiles"][0], {"name": "second-one", "steering": []}]}
    assert len(api(server, "POST", "/api/profiles/import", json=good).json()["data"]) == 2


def test_save_current_and_activation_checks(server, ids):
    a, b = ids
    api(
        server,
        "POST",
        "/api/steering/features",
        json={
            "features": [
                {"sae_id": a, "index": 5, "strength": 3},
                {"sae_id": b, "index": 6, "strength": -4},
            ]
        },
    )
    saved = api(server, "POST", "/api/profiles/save-current", json={"name": "snapshot"}).json()
    assert (
        saved["document"]["version"] == 2
        and saved["document"]["steering"]
        == [
            {"sae_id": a, "layer": 1, "features": [{"index": 5, "op": "add", "strength": 3.0}]},
            {"sae_id": b, "layer": 2, "features": [{"index": 6, "op": "add", "strength": -4.0}]},
        ]
        or saved["document"]["steering"]
        == [
            {"sae_id": b, "layer": 2, "features": [{"index": 6, "op": "add", "strength": -4.0}]},
            {"sae_id": a, "layer": 1, "features": [{"index": 5, "op": "add", "strength": 3.0}]},
        ]
    )
    api(server, "POST", "/api/profiles", json=profile_doc("foreign", "sae_ffffffffffff"))
    body = error(
        api(server, "POST", "/api/profiles/foreign/activate"), 400, "profile_not_applicable"
    )
    assert "not attached" in body["message"]
    assert api(server, "GET", "/api/steering").json()["active_profile"] is None
    api(server, "POST", "/api/profiles/snapshot/activate")
    live_change = api(
        server, "PUT", f"/api/steering/saes/{a}/features/1", json={"strength": 2}
    ).json()
    assert live_change["live"] is False and "profile is active" in live_change["reason"]
    api(server, "DELETE", "/api/profiles/snapshot")
    assert api(server, "GET", "/api/steering").json()["active_profile"] is None


def test_embeddings_shape_usage_and_refusals(server, llama_lm):
    response = api(
        server, "POST", "/v1/embeddings", json={"model": MODEL, "input": "The cat runs"}
    ).json()
    assert response["object"] == "list" and len(response["data"][0]["embedding"]) == 64
    assert (
        response["usage"]["prompt_tokens"]
        == len(llama_lm.tokenizer("The cat runs")["input_ids"])
        == response["usage"]["total_tokens"]
    )
    ids_in = api(
        server,
        "POST",
        "/v1/embeddings",
        json={"model": MODEL, "input": llama_lm.tokenizer("The cat runs")["input_ids"]},
    ).json()
    assert ids_in["data"][0]["embedding"] == response["data"][0]["embedding"]
    body = error(
        api(server, "POST", "/v1/embeddings", json={"model": MODEL, "input": [1] * 3000}),
        400,
        "context_length_exceeded",
    )
    assert "2048" in body["message"] and "3000" in body["message"]
    error(
        api(server, "POST", "/v1/embeddings", json={"model": MODEL, "input": "x", "dimensions": 8}),
        400,
        "field_not_honoured",
    )
    error(api(server, "POST", "/v1/embeddings", json={"model": MODEL, "input": []}), 400)
    error(
        api(
            server,
            "POST",
            "/v1/embeddings",
            json={"model": MODEL, "input": "x", "encoding_format": "hex"},
        ),
        400,
    )
    error(
        api(server, "POST", "/v1/embeddings", json={"model": "nope", "input": "x"}),
        404,
        "model_not_found",
    )
    sdk_vectors = sdk(server).embeddings.create(model=MODEL, input=["The cat runs"])
    assert sdk_vectors.data[0].embedding == response["data"][0]["embedding"]


def test_embeddings_pool_and_normalize_as_asked_and_are_never_steered(server, ids, llama_lm):
    a, b = ids
    texts = ["The cat runs", "Paris"]
    hidden, _ = llama_lm.runner.hidden_states([llama_lm.tokenizer(texts[0])["input_ids"]])

    def vectors(**fields) -> list[list[float]]:
        response = api(
            server, "POST", "/v1/embeddings", json={"model": MODEL, "input": texts, **fields}
        )
        assert response.status_code == 200, response.text
        return [entry["embedding"] for entry in response.json()["data"]]

    plain = {pooling: vectors(pooling=pooling) for pooling in ("mean", "last", "cls")}
    assert plain["mean"] == vectors()  # the default is the mean
    assert plain["last"][0] == pytest.approx(hidden[0, -1].tolist(), abs=1e-4)
    assert plain["cls"][0] == pytest.approx(hidden[0, 0].tolist(), abs=1e-4)
    assert plain["cls"][0] == pytest.approx(plain["cls"][1], abs=1e-5)  # both start with BOS
    scaled = vectors(pooling="last", normalize=True)
    norms = [sum(x * x for x in vector) ** 0.5 for vector in scaled]
    assert norms == pytest.approx([1.0, 1.0], abs=1e-5)
    length = sum(x * x for x in plain["last"][0]) ** 0.5
    assert scaled[0] == pytest.approx([x / length for x in plain["last"][0]], abs=1e-5)
    api(
        server,
        "POST",
        "/api/steering/features",
        json={"features": [{"sae_id": a, "index": 0, "strength": 150}]},
    )
    assert {pooling: vectors(pooling=pooling) for pooling in plain} == plain
    error(
        api(
            server, "POST", "/v1/embeddings", json={"model": MODEL, "input": "x", "pooling": "max"}
        ),
        400,
        "invalid_parameter",
    )


def test_embeddings_refuse_what_the_request_alone_decides(server, ids):
    def refused(value, **fields) -> dict:
        return api(
            server, "POST", "/v1/embeddings", json={"model": MODEL, "input": value, **fields}
        ).json()["error"]

    long = [1] * 3000
    over = refused([[5, 6], long, [7], long])
    assert over["code"] == "context_length_exceeded" and over["param"] == "input[1]"
    assert "input[1] is 3000 tokens and input[3] is 3000 tokens" in over["message"]
    assert refused(["a", ""])["param"] == "input[1]"
    many = refused(["a"] * 129)
    assert many["param"] == "input" and "the limit is 128" in many["message"]


def test_state_survives_a_restart(server, ids, home, tiny_dirs):
    a, b = ids
    api(
        server,
        "POST",
        "/api/steering/features",
        json={"features": [{"sae_id": a, "index": 11, "strength": 13}]},
    )
    api(server, "POST", "/api/profiles", json=profile_doc("kept-after-restart", a, layer=1))
    api(server, "POST", "/api/steering/disable")
    before = api(server, "GET", "/api/steering").json()
    profiles_before = api(server, "GET", "/api/profiles").json()["data"]
    server.stop()
    restarted = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    server.__dict__.update(restarted.__dict__)  # later tests in this module use the new process
    server.wait_ready()
    after = api(server, "GET", "/api/steering").json()
    assert after == before
    assert api(server, "GET", "/api/profiles").json()["data"] == profiles_before
    assert {
        s["id"]: s["attached_layer"] for s in api(server, "GET", "/api/saes").json()["data"]
    } == {a: 1, b: 2}
