"""/api/clusters, /api/circuits, steering_intensity and the rung header on a live server with two
SAEs."""

import json
from urllib.parse import unquote

import pytest

from tests.api.clients import MODEL, api, error, sse_events
from tests.support.mistudio_docs import circuit, cluster, raw
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens

USER = [{"role": "user", "content": "Tell me about the river."}]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("documents-home")


@pytest.fixture(scope="module")
def server(tiny_dirs, home, tmp_path_factory):
    base = tmp_path_factory.mktemp("doc-saes")
    process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    try:
        process.wait_ready()
        for layer in (1, 2):
            sae = api(
                process,
                "POST",
                "/api/saes",
                json={"path": str(build_saelens(base / f"l{layer}", layer=layer, seed=60 + layer))},
            ).json()["id"]
            api(process, "POST", f"/api/saes/{sae}/attach")
        yield process
    finally:
        process.stop()


@pytest.fixture
def clean(server):
    api(server, "POST", "/api/clusters/deactivate")
    api(server, "POST", "/api/circuits/deactivate")
    api(server, "DELETE", "/api/steering/features")
    api(server, "POST", "/api/steering/enable")
    return {s["layer"]: s["id"] for s in api(server, "GET", "/api/saes").json()["data"]}


def chat(server, **extra):
    response = api(
        server,
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 10, "temperature": 0, **extra},
    )
    assert response.status_code == 200, response.text
    return response


def import_cluster(server, doc, **params):
    return api(
        server,
        "POST",
        "/api/clusters/import",
        content=raw(doc),
        params=params,
        headers={"content-type": "application/json"},
    )


def test_cluster_import_export_is_byte_for_byte(server, clean):
    body = raw(cluster(name="exported-one"))
    created = api(
        server,
        "POST",
        "/api/clusters/import",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert created.status_code == 201
    row = created.json()["data"][0]
    exported = api(server, "GET", f"/api/clusters/{row['id']}/export")
    assert exported.content == body
    assert json.loads(exported.content)["x_unknown_top"] == {"kept": [1, 2, 3]}
    got = api(server, "GET", "/api/clusters/exported-one").json()
    assert (
        got["members"][1] == {"feature_idx": 7, "strength": 20.0, "sign": -1, "label": "bank"}
        and got["intensity"] == 1.0
    )
    assert "exported-one" in [c["name"] for c in api(server, "GET", "/api/clusters").json()["data"]]
    assert api(server, "DELETE", "/api/clusters/exported-one").json()["deleted"]
    error(api(server, "GET", "/api/clusters/exported-one"), 404, "cluster_not_found")


def test_conflicts_bundles_caps_and_refusals(server, clean):
    first = import_cluster(server, cluster(name="dup")).json()["data"][0]
    renamed = import_cluster(server, cluster(name="dup")).json()["data"][0]
    assert renamed["name"] == "dup-2" and renamed["id"] != first["id"]
    error(import_cluster(server, cluster(name="dup"), on_conflict="fail"), 409, "name_exists")
    before = len(api(server, "GET", "/api/clusters").json()["data"])
    bundle = {
        "kind": "mistudio.cluster-bundle",
        "schema_version": "1",
        "definitions": [cluster(name="b1"), {**cluster(name="b2"), "members": []}],
    }
    body = error(api(server, "POST", "/api/clusters/import", json=bundle), 400, "invalid_document")
    assert "definitions[1].members" in body["message"]
    # nothing half-imported
    assert len(api(server, "GET", "/api/clusters").json()["data"]) == before
    good = {**bundle, "definitions": [cluster(name="b1"), cluster(name="b2")]}
    assert [
        c["name"] for c in api(server, "POST", "/api/clusters/import", json=good).json()["data"]
    ] == ["b1", "b2"]
    huge = cluster(name="huge", extra={"narrative": "x" * 9000, "padding": "y" * 1_000_001})
    error(import_cluster(server, huge), 413, "document_too_large")
    error(
        api(
            server,
            "POST",
            "/api/clusters/import",
            content=b"{nope",
            headers={"content-type": "application/json"},
        ),
        400,
    )


def test_dial_bounds_and_activation_figures(server, clean):
    row = import_cluster(server, cluster(name="dialled")).json()["data"][0]
    assert (
        api(server, "PUT", f"/api/clusters/{row['id']}/intensity", json={"intensity": 1.5}).json()[
            "intensity"
        ]
        == 1.5
    )
    error(api(server, "PUT", f"/api/clusters/{row['id']}/intensity", json={"intensity": 2.5}), 400)
    error(api(server, "PUT", f"/api/clusters/{row['id']}/intensity", json={"intensity": -0.1}), 400)
    narrow = import_cluster(server, cluster(name="narrow", n_features=64)).json()["data"][0]
    body = error(
        api(server, "POST", f"/api/clusters/{narrow['id']}/activate"), 400, "cluster_not_applicable"
    )
    assert "n_features 64" in body["message"] and "128" in body["message"]
    nowhere = import_cluster(server, cluster(name="nowhere", layer=0)).json()["data"][0]
    assert (
        "no SAE is attached at layer 0"
        in error(api(server, "POST", f"/api/clusters/{nowhere['id']}/activate"), 400)["message"]
    )
    past = import_cluster(
        server, cluster(name="past", members=[{"feature_idx": 500, "strength": 1}])
    ).json()["data"][0]
    error(api(server, "POST", f"/api/clusters/{past['id']}/activate"), 400, "invalid_feature_index")
    assert api(server, "GET", "/api/steering").json()["active_base"] is None


def test_an_import_whose_activation_is_refused_stores_nothing(server, clean):
    before = api(server, "GET", "/api/clusters").json()["data"]
    body = error(
        import_cluster(server, cluster(name="unbindable", layer=0), activate="true"),
        400,
        "cluster_not_applicable",
    )
    assert "no SAE is attached at layer 0" in body["message"]
    assert api(server, "GET", "/api/clusters").json()["data"] == before
    error(api(server, "GET", "/api/clusters/unbindable"), 404, "cluster_not_found")


def test_cluster_steering_and_the_per_request_dial(server, clean):
    sae = clean[1]
    plain = chat(server).json()["choices"][0]["message"]["content"]
    row = import_cluster(
        server, cluster(name="steer-me", intensity_range=[0.5, 1.5]), activate="true"
    ).json()["data"][0]
    assert row["active"] is True
    dialled = chat(server, steering_intensity=1.8)
    assert dialled.headers["x-millm-steering-intensity"] == "1.5"  # capped at the declared maximum
    kind, params = member(dialled.headers["x-millm-steering"])
    assert (kind, params["name"], params["base"]) == ("profile", "steer-me", "cluster")
    assert params["intensity"] == "1.5" and params["source"] == "active"
    # The same applied strengths set as live values give the same text: the deltas are equal.
    api(server, "POST", "/api/clusters/deactivate")
    api(
        server,
        "POST",
        "/api/steering/features",
        json={
            "features": [
                {"sae_id": sae, "index": 3, "strength": 15.0},
                {"sae_id": sae, "index": 7, "strength": -30.0},
                {"sae_id": sae, "index": 9, "strength": 200.0},
            ]
        },
    )
    assert (
        chat(server).json()["choices"][0]["message"]["content"]
        == dialled.json()["choices"][0]["message"]["content"]
    )
    assert "x-millm-steering-intensity" not in chat(server).headers  # no dial, no echo
    api(server, "DELETE", "/api/steering/features")
    api(server, "POST", f"/api/clusters/{row['id']}/activate")
    off = chat(server, steering_intensity="off")
    assert (
        off.json()["choices"][0]["message"]["content"] == plain
        and off.headers["x-millm-steering-intensity"] == "0.0"
    )
    assert chat(server, steering_intensity="min").headers["x-millm-steering-intensity"] == "0.5"
    error(
        api(
            server,
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": USER, "steering_intensity": 2.5},
        ),
        400,
        "invalid_parameter",
    )
    error(
        api(
            server,
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": USER, "steering_intensity": "loud"},
        ),
        400,
        "invalid_parameter",
    )
    scoring = api(
        server,
        "POST",
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": USER,
            "max_tokens": 1,
            "logprobs": True,
            "steering_intensity": 1,
        },
    )
    error(scoring, 400, "field_not_honoured")
    error(
        api(
            server,
            "POST",
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "x",
                "max_tokens": 1,
                "logprobs": 1,
                "steering_intensity": 1,
            },
        ),
        400,
        "field_not_honoured",
    )
    api(server, "POST", "/api/steering/disable")
    # disabled, dial-only
    assert "x-millm-steering-intensity" not in chat(server, steering_intensity=1.0).headers


def test_a_cluster_named_outside_ascii_steers_and_its_header_carries_the_name_percent_encoded(
    server, clean
):
    # RFC 8941 strings are printable ASCII; a name like this one made every completion a 500 before.
    row = import_cluster(server, cluster(name="café 水"), activate="true").json()["data"][0]
    assert row["active"] is True and row["name"] == "café 水"
    for stream in (False, True):
        response = chat(server, stream=stream)
        said = (
            sse_events(response.text)[-2]["millm_steering"]
            if stream
            else response.headers["x-millm-steering"]
        )
        assert said.startswith('profile;name="caf%C3%A9 %E6%B0%B4"')
        assert unquote(member(said)[1]["name"]) == "café 水"
    api(server, "DELETE", f"/api/clusters/{row['id']}")


def import_circuit(server, doc, **params):
    return api(
        server,
        "POST",
        "/api/circuits/import",
        content=raw(doc),
        params=params,
        headers={"content-type": "application/json"},
    )


def test_circuit_rung_activation_and_header(server, clean):
    doc = circuit(name="causal", rungs=(2, 3), intensity_range=[0.5, 1.5])
    created = import_circuit(server, doc)
    assert created.status_code == 201
    row = created.json()
    assert row["rung"] == 2 and row["language"] == "causally validated (edge)"
    assert api(server, "GET", f"/api/circuits/{row['id']}/export").content == raw(doc)
    weak = import_circuit(server, circuit(name="weak", rungs=(1, 3))).json()
    body = error(
        api(server, "POST", f"/api/circuits/{weak['id']}/activate"), 400, "rung_not_acknowledged"
    )
    assert "rung 1" in body["message"]
    api(server, "POST", f"/api/circuits/{weak['id']}/activate", json={"acknowledge_rung": True})
    weak_response = chat(server)
    assert (
        weak_response.headers["x-millm-circuit-rung"]
        == '1;language="suggested (attribution-supported)"'
    )
    # another circuit while one is active: refused, saying why (CIRCUIT_ALLOW_CONCURRENT is off)
    second = error(api(server, "POST", f"/api/circuits/{row['id']}/activate"), 409)
    assert second["code"] == "circuit_concurrency_disabled" and "'weak'" in second["message"]
    api(server, "POST", "/api/circuits/deactivate")
    api(server, "POST", f"/api/circuits/{row['id']}/activate")
    active = api(server, "GET", "/api/circuits/active", params={"single": "true"}).json()
    assert (
        active["circuit"]["name"] == "causal"
        and active["steering"]["steering"] is True
        and active["steering"]["mode"] == "full"
    )
    response = chat(server, steering_intensity=0.1)
    assert response.headers["x-millm-circuit-rung"] == '2;language="causally validated (edge)"'
    # clamped up to the declared floor
    assert response.headers["x-millm-steering-intensity"] == "0.5"
    kind, params = member(response.headers["x-millm-steering"])
    assert (kind, params["name"], params["mode"], params["intensity"]) == (
        "circuit",
        "causal",
        "full",
        "0.5",
    )
    assert params["id"] == row["id"]
    off = chat(server, steering_intensity=0)
    assert "x-millm-circuit-rung" not in off.headers  # not steering: no rung


def test_min_on_a_circuit_without_a_range_is_off_and_says_so_as_off_does(server, clean):
    """The circuit rule's floor is 0 without a declared range, so "min" resolves to 0: the same
    answer as "off", and the same echo (0.0), not a silent unsteered answer."""
    row = import_circuit(server, circuit(name="rangeless")).json()
    assert api(server, "POST", f"/api/circuits/{row['id']}/activate").status_code == 200
    steered = chat(server)
    off, low = chat(server, steering_intensity="off"), chat(server, steering_intensity="min")
    assert member(steered.headers["x-millm-steering"])[1]["name"] == "rangeless"
    texts = [r.json()["choices"][0]["message"]["content"] for r in (steered, off, low)]
    assert texts[1] == texts[2] != texts[0]
    assert off.headers["x-millm-steering-intensity"] == "0.0"
    assert low.headers["x-millm-steering-intensity"] == "0.0"
    assert low.headers["x-millm-steering"] == 'none;reason="steering_intensity min is 0"'
    assert "x-millm-circuit-rung" not in low.headers


def test_slice_fallback_and_unbound_circuits_carry_no_rung(server, clean):
    sliced = import_circuit(server, circuit(name="sliced", n_features=(128, 64))).json()
    api(server, "POST", f"/api/circuits/{sliced['id']}/activate")
    status = api(server, "GET", "/api/circuits/active", params={"single": "true"}).json()[
        "steering"
    ]
    assert (
        status["mode"] == "slice_fallback"
        and status["steering"] is True
        and status["rung_header"] is False
    )
    assert [b["status"] for b in status["bindings"]] == ["bind", "block"]
    response = chat(server, steering_intensity="min")
    assert "x-millm-circuit-rung" not in response.headers
    assert response.headers["x-millm-steering-intensity"] == "0.5"  # cluster rule: the 0.5 floor
    far = import_circuit(server, circuit(name="far", layers=(0, 0))).json()
    assert api(server, "GET", f"/api/circuits/{far['id']}").json()["steering"]["mode"] == "none"
    # Active, it would refuse every request (nothing binds): activation says so and changes nothing.
    body = error(
        api(server, "POST", f"/api/circuits/{far['id']}/activate"), 400, "invalid_feature_index"
    )
    assert "'far'" in body["message"] and "no SAE is attached at layer 0" in body["message"]
    assert (
        api(server, "GET", "/api/circuits/active", params={"single": "true"}).json()["circuit"][
            "name"
        ]
        == "sliced"
    )
    api(server, "POST", "/api/circuits/deactivate")
    assert api(server, "GET", "/api/circuits/active", params={"single": "true"}).json() == {
        "circuit": None,
        "steering": {"steering": False, "mode": "none", "reason": "no active circuit"},
    }


def test_documents_and_dials_survive_a_restart(server, clean, home, tiny_dirs):
    row = import_cluster(server, cluster(name="persisted")).json()["data"][0]
    api(server, "PUT", f"/api/clusters/{row['id']}/intensity", json={"intensity": 0.7})
    api(server, "POST", f"/api/clusters/{row['id']}/activate")
    circuits_before = api(server, "GET", "/api/circuits").json()["data"]
    server.stop()
    restarted = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    server.__dict__.update(restarted.__dict__)
    server.wait_ready()
    assert api(server, "GET", "/api/clusters/persisted").json()["intensity"] == 0.7
    assert api(server, "GET", "/api/steering").json()["active_base"]["name"] == "persisted"
    assert [c["id"] for c in api(server, "GET", "/api/circuits").json()["data"]] == [
        c["id"] for c in circuits_before
    ]
