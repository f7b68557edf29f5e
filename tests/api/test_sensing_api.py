"""Co-activation sensing on an active cluster and edge sensing on an active circuit, on a live
server (tiny Llama, TopK SAEs at layers 1 and 2): the events a row records equal the arithmetic
over the member activations the same request reads (pre-steering), the quorum, context, history,
caps and refusals, unsensable edges with why, and rows in a continuous batch record the events
they record alone."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from millm.interp.sensing import co_activations, edge_observations
from tests.api.clients import MODEL, api, error, post
from tests.support.busy_features import busiest, sensed_cluster
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

PROMPT = "The old river runs quickly to the sea, and the sea"
CAP = 3  # events a row records per base (SENSING_MAX_EVENTS_PER_REQUEST)


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("sensing-saes")
    return {
        layer: build_saelens(base / f"l{layer}", layer=layer, seed=40 + layer) for layer in (1, 2)
    }


def start(home, tiny_dirs, sae_dirs, **env) -> ServerProcess:
    process = ServerProcess(
        home,
        ["--model", str(tiny_dirs["llama"])],
        env={"SENSING_MAX_EVENTS_PER_REQUEST": str(CAP), **env},
    ).wait_ready()
    process.saes = {}
    for layer, path in sae_dirs.items():
        sae = api(process, "POST", "/api/saes", json={"path": str(path)}).json()["id"]
        api(process, "POST", f"/api/saes/{sae}/attach")
        process.saes[layer] = sae
    return process


@pytest.fixture(scope="module")
def server(tiny_dirs, sae_dirs, tmp_path_factory):
    process = start(tmp_path_factory.mktemp("sensing-home"), tiny_dirs, sae_dirs)
    yield process
    process.stop()


def completion(server, layer: int, features: list[int], **extra) -> dict:
    """A greedy completion reading `features` of the SAE at `layer` before its steering."""
    ask = {
        "sae_id": server.saes[layer],
        "positions": "all",
        "features": features,
        "read_point": "pre_steering",
    }
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    response = post(server, "/v1/completions", {**body, "return_sae_activations": ask, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def activations(answer: dict, features: list[int]) -> tuple[list[int], list[list[float]]]:
    positions = answer["millm"]["sae_activations"]["positions"]
    values = [{f["index"]: f["value"] for f in p["features"]} for p in positions]
    return [p["position"] for p in positions], [[v.get(f, 0.0) for f in features] for v in values]


def busy(server, layer: int, count: int) -> list[tuple[int, float]]:
    """The `count` features firing at the most positions of PROMPT's completion, with their peak."""
    return busiest(server, server.saes[layer], PROMPT, 12)[:count]


def events(server, kind: str, **params) -> list[dict]:
    path = "/api/sensing/events" if kind == "cluster" else "/api/circuit-sensing/events"
    found = api(server, "GET", path, params={"limit": 500, **params}).json()["data"]
    return sorted(found, key=lambda e: (e.get("pos_start", 0), e.get("down", {}).get("pos", 0)))


def mine(found: list[dict], answer: dict) -> list[dict]:
    return [e for e in found if e["request_id"] == answer["id"]]


def import_doc(server, what: str, doc: dict) -> dict:
    response = api(
        server,
        "POST",
        f"/api/{what}/import",
        content=json.dumps(doc),
        headers={"content-type": "application/json"},
    )
    assert response.status_code in (200, 201), response.text
    body = response.json()
    return body["data"][0] if "data" in body else body


@pytest.fixture
def cluster(server):
    """A cluster of the three busiest features at layer 1 (steering them by almost nothing),
    active, sensed; its events and documents gone afterwards."""
    members = busy(server, 1, 3)
    row = import_doc(server, "clusters", sensed_cluster("busy-three", 1, members))
    assert api(server, "POST", f"/api/clusters/{row['id']}/activate").status_code == 200
    yield row, members
    api(server, "POST", "/api/clusters/deactivate")
    api(server, "DELETE", "/api/sensing/events")
    api(server, "DELETE", f"/api/clusters/{row['id']}")


def expected_cluster(answer, members, min_k):
    features = [f for f, _ in members]
    positions, acts = activations(answer, features)
    thetas = [0.1 * peak for _, peak in members]
    return co_activations(acts, positions, features, thetas, min_k, CAP)


def test_a_sensed_cluster_records_the_co_activations_its_rows_read(server, cluster):
    row, members = cluster
    assert api(server, "GET", "/api/sensing/status").json()["armed"] is False  # not switched on
    switched = api(server, "POST", f"/api/sensing/{row['id']}/enable").json()
    assert switched == {
        "profile_id": row["id"],
        "name": "busy-three",
        "sensing_enabled": True,
        "armed": True,
    }
    status = api(server, "GET", "/api/sensing/status").json()
    assert (status["armed"], status["member_count"], status["sensable_count"], status["min_k"]) == (
        True,
        3,
        3,
        3,
    )
    assert status["threshold_mode"] == "epsilon_max" and status["enabled_clusters"][0]["is_active"]
    features = [f for f, _ in members]
    for min_k in (3, 2, 1):
        if min_k != 3:
            assert (
                api(
                    server, "PUT", f"/api/sensing/{row['id']}/config", json={"min_k": min_k}
                ).status_code
                == 200
            )
        answer = completion(server, 1, features)
        expected = expected_cluster(answer, members, min_k)
        recorded = mine(events(server, "cluster", cluster_id=row["id"]), answer)
        assert [(e["pos_start"], e["pos_end"], e["truncated"]) for e in recorded] == [
            (e.pos_start, e.pos_end, e.truncated) for e in expected
        ], min_k
        for got, want in zip(recorded, expected, strict=True):
            assert [m[0] for m in got["fired_members"]] == [m[0] for m in want.fired_members]
            assert [m[1] for m in got["fired_members"]] == pytest.approx(
                [m[1] for m in want.fired_members], abs=1e-4
            )
            assert got["score"] == pytest.approx(want.score, rel=1e-4)
            assert got["phase"] == (
                "prefill" if got["pos_start"] < answer["usage"]["prompt_tokens"] else "decode"
            )
            assert len(got["summary"]) <= 300 and got["layer"] == 1
    assert len(expected) >= 1 and len(recorded) <= CAP
    # the quorum is one to the sensable members; null restores "all of them"
    refused = error(api(server, "PUT", f"/api/sensing/{row['id']}/config", json={"min_k": 4}), 400)
    assert refused["param"] == "min_k" and "3 members, 3 of them sensable" in refused["message"]
    assert api(server, "GET", "/api/sensing/status").json()["min_k"] == 1  # unchanged
    api(server, "PUT", f"/api/sensing/{row['id']}/config", json={"min_k": None})
    assert api(server, "GET", "/api/sensing/status").json()["min_k"] == 3


def test_context_is_the_tokens_around_the_span_or_none(server, cluster):
    row, members = cluster
    api(server, "POST", f"/api/sensing/{row['id']}/enable")
    api(server, "PUT", f"/api/sensing/{row['id']}/config", json={"min_k": 1, "context_tokens": 4})
    answer = completion(server, 1, [f for f, _ in members])
    recorded = mine(events(server, "cluster", cluster_id=row["id"]), answer)
    assert recorded
    one = api(server, "GET", f"/api/sensing/events/{recorded[0]['id']}").json()
    parts = one["context_parts"]
    assert parts["before"] + parts["span"] + parts["after"] == one["context_text"]
    span = one["pos_end"] - one["pos_start"] + 1
    assert len(one["context_token_ids"]) <= span + 8
    api(server, "PUT", f"/api/sensing/{row['id']}/config", json={"context_tokens": 0})
    api(server, "DELETE", "/api/sensing/events")
    answer = completion(server, 1, [f for f, _ in members], prompt="The sea")
    bare = mine(events(server, "cluster", cluster_id=row["id"]), answer)
    assert bare and all(e["context_text"] is None and e["context_parts"] is None for e in bare)
    missing = error(api(server, "GET", "/api/sensing/events/sense_nope"), 404)
    assert missing["code"] == "sensing_event_not_found"


def test_a_resent_conversation_is_reported_once_until_rearmed(server, cluster):
    row, members = cluster
    api(server, "POST", f"/api/sensing/{row['id']}/enable")
    api(server, "PUT", f"/api/sensing/{row['id']}/config", json={"min_k": 1})
    features = [f for f, _ in members]
    first = completion(server, 1, features)
    again = completion(server, 1, features)  # the same tokens: everything was reported
    found = events(server, "cluster", cluster_id=row["id"])
    assert mine(found, first) and not mine(found, again)
    api(server, "PUT", f"/api/sensing/{row['id']}/config", json={"context_tokens": 8})  # re-armed
    third = completion(server, 1, features)
    assert len(mine(events(server, "cluster", cluster_id=row["id"]), third)) == len(
        mine(found, first)
    )


def test_a_cluster_that_cannot_be_sensed_is_refused_and_nothing_changes(server):
    doc = {
        "kind": "mistudio.cluster-definition",
        "schema_version": "1",
        "name": "no-maxima",
        "sae": {"layer": 1, "n_features": 128},
        "members": [{"feature_idx": 3, "strength": 0.001}, {"feature_idx": 4, "strength": 0.001}],
    }
    row = import_doc(server, "clusters", doc)
    api(server, "POST", f"/api/clusters/{row['id']}/activate")
    try:
        refused = error(
            api(server, "POST", f"/api/sensing/{row['id']}/enable"), 400, "not_sensable"
        )
        assert "max_activation" in refused["message"]
        assert api(server, "GET", "/api/sensing/status").json()["enabled_clusters"] == []
        # a floor above 0 makes them sensable (floor_only)
        assert (
            api(
                server, "PUT", f"/api/sensing/{row['id']}/config", json={"theta_floor": 0.5}
            ).status_code
            == 200
        )
        assert api(server, "POST", f"/api/sensing/{row['id']}/enable").json()["armed"] is True
        assert api(server, "GET", "/api/sensing/status").json()["threshold_mode"] == "floor_only"
        error(api(server, "POST", "/api/sensing/no-such-cluster/enable"), 404)
    finally:
        api(server, "POST", "/api/clusters/deactivate")
        api(server, "DELETE", f"/api/clusters/{row['id']}")
    assert api(server, "GET", "/api/sensing/status").json()["enabled_clusters"] == []


@pytest.fixture
def circuit(server):
    """A circuit over layers 1 and 2: an edge from a busy layer-1 feature to a busy layer-2 one
    (rung 1), and edges it cannot sense (a layer with no SAE, a cluster endpoint, no maximum)."""
    (up, up_peak), (other, _) = busy(server, 1, 2)
    (down, down_peak), (quiet, _) = busy(server, 2, 2)
    doc = {
        "kind": "mistudio.circuit-definition",
        "schema_version": "1",
        "name": "up-then-down",
        "saes": [{"layer": 1, "n_features": 128}, {"layer": 2, "n_features": 128}],
        "members": [
            {
                "layer": 1,
                "feature": {"feature_idx": up, "strength": 0.001, "max_activation": up_peak},
            },
            {"layer": 1, "feature": {"feature_idx": other, "strength": 0.001}},
            {
                "layer": 2,
                "feature": {"feature_idx": down, "strength": 0.001, "max_activation": down_peak},
            },
            {"layer": 2, "feature": {"feature_idx": quiet, "strength": 0.001}},
        ],
        "edges": [
            {
                "up": {"layer": 1, "feature_idx": up},
                "down": {"layer": 2, "feature_idx": down},
                "rung": 1,
            },
            {
                "up": {"layer": 1, "feature_idx": up},
                "down": {"layer": 3, "feature_idx": 9},
                "rung": 0,
            },
            {
                "up": {"layer": 1, "feature_idx": up, "kind": "cluster"},
                "down": {"layer": 2, "feature_idx": down},
            },
            {"up": {"layer": 1, "feature_idx": other}, "down": {"layer": 2, "feature_idx": quiet}},
        ],
    }
    row = import_doc(server, "circuits", doc)
    activated = api(
        server,
        "POST",
        f"/api/circuits/{row['id']}/activate",
        json={"acknowledge_rung": True},
    )
    assert activated.status_code == 200, activated.text
    yield row, (up, up_peak), (down, down_peak)
    api(server, "POST", "/api/circuits/deactivate")
    api(server, "DELETE", "/api/circuit-sensing/events", params={"circuit_id": row["id"]})
    api(server, "DELETE", f"/api/circuits/{row['id']}")


def test_a_sensed_circuit_records_its_edges_and_names_those_it_cannot_sense(server, circuit):
    row, (up, up_peak), (down, down_peak) = circuit
    assert api(server, "POST", f"/api/circuit-sensing/{row['id']}/enable").json()["armed"] is True
    status = api(server, "GET", "/api/circuit-sensing/status").json()
    key = f"{up}@1->{down}@2"
    assert status["armed"] and status["sensable_edges"] == [key] and status["layers"] == [1, 2]
    reasons = {e["edge_key"]: e["reason"] for e in status["unsensable_edges"]}
    assert sorted(reasons.values()) == [
        "endpoint_not_a_feature",
        "layer_not_attached",
        "no_activation_threshold",
    ]
    assert reasons[f"{up}@1->9@3"] == "layer_not_attached"
    seen: dict[int, int] = {}
    for lag in (8, 2):
        api(server, "PUT", f"/api/circuit-sensing/{row['id']}/config", json={"max_token_lag": lag})
        first = completion(server, 1, [up])
        second = completion(server, 2, [down])
        assert second["choices"][0]["text"] == first["choices"][0]["text"]
        positions, ups = activations(first, [up])
        _, downs = activations(second, [down])
        expected = edge_observations(
            [a[0] for a in ups],
            0.1 * up_peak,
            [a[0] for a in downs],
            0.1 * down_peak,
            positions,
            lag,
        )[:CAP]
        recorded = [
            e
            for e in events(server, "circuit", circuit_id=row["id"])
            if e["request_id"] in (first["id"], second["id"])
        ]
        seen[lag] = len(expected)
        # both requests were sensed alike (the same tokens); the second's is compared
        got = [e for e in recorded if e["request_id"] == second["id"]]
        assert len(got) == len([e for e in recorded if e["request_id"] == first["id"]])
        assert [(e["up"]["pos"], e["down"]["pos"], e["token_lag"]) for e in got] == [
            (o.up_pos, o.down_pos, o.token_lag) for o in expected
        ], lag
        for event in got:
            assert event["edge_key"] == key and 1 <= event["token_lag"] <= lag
            assert (
                event["edge_rung"] == 1
                and event["edge_rung_language"] == "suggested (attribution-supported)"
            )
            assert "causal" not in event["summary"]
        api(server, "DELETE", "/api/circuit-sensing/events", params={"circuit_id": row["id"]})
    assert seen[8] >= 1, seen  # the edge is seen in this row, so the comparison says something
    assert api(server, "GET", "/api/circuit-sensing/status").json()["requests_sensed"] >= 4
    missing = error(api(server, "GET", "/api/circuit-sensing/events/sense_nope"), 404)
    assert missing["code"] == "circuit_sensing_event_not_found"
    assert api(server, "POST", f"/api/circuit-sensing/{row['id']}/disable").json()["armed"] is False


def test_rows_in_a_continuous_batch_record_what_they_record_alone(tiny_dirs, sae_dirs, tmp_path):
    server = start(
        tmp_path,
        tiny_dirs,
        sae_dirs,
        SENSING_DEDUP_HISTORY="false",
        ENABLE_CONTINUOUS_BATCHING="true",
    )
    try:
        members = busy(server, 1, 3)
        row = import_doc(server, "clusters", sensed_cluster("batched", 1, members))
        api(server, "POST", f"/api/clusters/{row['id']}/activate")
        api(server, "POST", f"/api/sensing/{row['id']}/enable")
        api(server, "PUT", f"/api/sensing/{row['id']}/config", json={"min_k": 1})
        prompts = [f"{PROMPT} {word}" for word in ("north", "south", "east", "west", "up", "down")]

        def run(prompt: str) -> str:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0}
            return post(server, "/v1/completions", body).json()["id"]

        def said(ids: list[str]) -> list:
            found = events(server, "cluster", cluster_id=row["id"])
            return [
                [
                    (e["pos_start"], e["pos_end"], [m[0] for m in e["fired_members"]])
                    for e in found
                    if e["request_id"] == rid
                ]
                for rid in ids
            ]

        alone = said([run(p) for p in prompts])
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = said(list(pool.map(run, prompts)))
        assert together == alone and any(alone)
        health = api(server, "GET", "/api/health/inference").json()
        assert health["backend"] == "batched"
    finally:
        server.stop()
