"""Concurrent circuits with layer claims on a live server (tiny Llama, an SAE at each of its three
layers, CIRCUIT_ALLOW_CONCURRENT on): circuits on disjoint layers serve together, a contended
layer is refused with its details and composed only when asked, the same feature on a layer is
never shared, one circuit deactivated leaves the others' steering, the rung header is withheld
while several serve, and with the flag off a second activation is refused and a restart keeps
one; the claims table survives a restart."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.clients import MODEL, api, error
from tests.support.busy_features import busiest
from tests.support.server import ServerProcess
from tests.support.steering_header import members
from tests.support.tiny_saes import build_saelens

USER = [{"role": "user", "content": "Tell me about the city."}]


def circuit(name: str, features: dict[int, list[int]], strength: float = 40.0) -> dict:
    """A rung-2 circuit steering `features` (layer -> indices), an edge between its first two."""
    members = [
        {"layer": layer, "feature": {"feature_idx": f, "strength": strength}}
        for layer, indices in sorted(features.items())
        for f in indices
    ]
    ends = [{"layer": m["layer"], "feature_idx": m["feature"]["feature_idx"]} for m in members]
    return {
        "kind": "mistudio.circuit-definition",
        "schema_version": "1",
        "name": name,
        "saes": [{"layer": layer, "n_features": 128} for layer in sorted(features)],
        "members": members,
        "edges": [{"up": ends[0], "down": ends[-1], "rung": 2}],
    }


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("claims-saes")
    return [build_saelens(base / f"l{layer}", layer=layer, seed=60 + layer) for layer in (0, 1, 2)]


def start(home, tiny_dirs, sae_dirs, concurrent: bool, attach: bool = True) -> ServerProcess:
    env = {"CIRCUIT_ALLOW_CONCURRENT": "true" if concurrent else "false"}
    process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])], env=env).wait_ready()
    if attach:
        for path in sae_dirs:
            sae = api(process, "POST", "/api/saes", json={"path": str(path)}).json()["id"]
            api(process, "POST", f"/api/saes/{sae}/attach")
    return process


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("claims-home")


@pytest.fixture(scope="module")
def server(tiny_dirs, sae_dirs, home):
    process = start(home, tiny_dirs, sae_dirs, concurrent=True)
    yield process
    process.stop()


def imported(server, doc: dict) -> dict:
    response = api(
        server,
        "POST",
        "/api/circuits/import",
        content=json.dumps(doc),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 201, response.text
    return response.json()


def chat(server):
    body = {"model": MODEL, "messages": USER, "max_tokens": 10, "temperature": 0}
    response = api(server, "POST", "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], response.headers


@pytest.fixture
def circuits(server):
    """A on layers 0-1, B on layer 2, C on layer 1 (other features), D on layer 1 writing A's
    feature; none active before or after."""
    made = {
        "A": imported(server, circuit("A", {0: [3], 1: [5]})),
        "B": imported(server, circuit("B", {2: [7]})),
        "C": imported(server, circuit("C", {1: [9]})),
        "D": imported(server, circuit("D", {1: [5, 11]})),
    }
    yield made
    api(server, "POST", "/api/circuits/deactivate")
    for row in made.values():
        api(server, "DELETE", f"/api/circuits/{row['id']}")


def activate(server, row: dict, **params):
    return api(server, "POST", f"/api/circuits/{row['id']}/activate", params=params)


def claims(server) -> list[tuple[int, str, bool]]:
    data = api(server, "GET", "/api/circuits/claims").json()["data"]
    return [(c["layer"], c["circuit_name"], c["composed"]) for c in data]


def test_circuits_on_disjoint_layers_serve_together_and_a_contended_layer_is_refused(
    server, circuits
):
    plain, _ = chat(server)
    a, b, c = circuits["A"], circuits["B"], circuits["C"]
    assert activate(server, a).status_code == 200
    alone_a, headers = chat(server)
    assert alone_a != plain and "x-millm-circuit-rung" in headers
    both = activate(server, b).json()
    assert both["claimed_layers"] == [2] and both["composed_layers"] == []
    assert claims(server) == [(0, "A", False), (1, "A", False), (2, "B", False)]
    active = api(server, "GET", "/api/circuits/active").json()
    assert [(e["name"], e["claimed_layers"], e["serving_mode"]) for e in active] == [
        ("A", [0, 1], "full"),
        ("B", [2], "full"),
    ]
    a_and_b, headers = chat(server)
    assert "x-millm-circuit-rung" not in headers  # several serve: no one rung
    said = members(headers["x-millm-steering"])
    assert [(kind, p["id"]) for kind, p in said] == sorted(
        [("circuit", a["id"]), ("circuit", b["id"])], key=lambda m: m[1]
    )
    # C needs layer 1, held by A: refused whole, with the incumbent and the hazard
    refused = error(activate(server, c), 409, "circuit_layer_contention")
    details = refused["details"]
    assert details["contended_layers"] == [1] and details["incumbent"] == {
        "id": a["id"],
        "name": "A",
    }
    assert details["requested"] == {"id": c["id"], "name": "C"} and details["overridable"] is True
    assert details["override_param"] == "allow_layer_overlap" and details["colliding_keys"] == []
    assert "two_layers_at_strength_5" in details["measured_hazard"]
    assert "'A'" in refused["message"] and "allow_layer_overlap" in refused["message"]
    assert chat(server)[0] == a_and_b  # A's and B's steering untouched
    assert [e["name"] for e in api(server, "GET", "/api/circuits/active").json()] == ["A", "B"]
    assert ("1", "C") not in {(str(layer), name) for layer, name, _ in claims(server)}
    # composed on request
    composed = activate(server, c, allow_layer_overlap="true").json()
    assert composed["composed_layers"] == [1] and composed["allowed_layer_overlap"] is True
    assert "sum" in composed["warning"]
    assert claims(server) == [(0, "A", False), (1, "A", True), (1, "C", True), (2, "B", False)]
    text, headers = chat(server)
    assert "x-millm-circuit-rung" not in headers and text != a_and_b
    flags = {p["name"]: p.get("composed", False) for _, p in members(headers["x-millm-steering"])}
    assert flags == {"A": True, "B": False, "C": True}


def test_the_same_feature_on_a_layer_is_never_shared(server, circuits):
    a, d = circuits["A"], circuits["D"]
    activate(server, a)
    for params in ({}, {"allow_layer_overlap": "true"}):
        refused = error(activate(server, d, **params), 409, "circuit_layer_contention")
        details = refused["details"]
        assert details["overridable"] is False and "override_param" not in details
        assert details["colliding_keys"] == [{"layer": 1, "feature_idx": 5, "incumbent": a["id"]}]
    assert claims(server) == [(0, "A", False), (1, "A", False)]


def test_one_circuit_out_leaves_the_others_and_the_rung_header_returns(server, circuits):
    a, b, c = circuits["A"], circuits["B"], circuits["C"]
    for row in (b, c):
        assert activate(server, row).status_code == 200
    b_and_c, _ = chat(server)
    api(server, "POST", "/api/circuits/deactivate")
    for row, params in ((a, {}), (b, {}), (c, {"allow_layer_overlap": "true"})):
        assert activate(server, row, **params).status_code == 200
    out = api(server, "POST", f"/api/circuits/{a['id']}/deactivate").json()
    assert out["released_layers"] == [0, 1] and out["still_claimed_layers"] == [1, 2]
    assert claims(server) == [(1, "C", False), (2, "B", False)]
    assert chat(server)[0] == b_and_c  # C's keys on layer 1 are still applied, as with B alone
    api(server, "POST", f"/api/circuits/{b['id']}/deactivate")
    _, headers = chat(server)
    assert headers["x-millm-circuit-rung"].startswith("2;")  # one circuit, nothing composed
    released = api(server, "POST", "/api/circuits/claims/release", params={"circuit_id": "nope"})
    assert released.json()["warnings"] and released.json()["released_layers"] == []


def test_with_the_flag_off_a_second_circuit_is_refused_and_a_restart_keeps_one(
    tiny_dirs, sae_dirs, tmp_path
):
    on = start(tmp_path, tiny_dirs, sae_dirs, concurrent=True)
    try:
        a = imported(on, circuit("A", {0: [3], 1: [5]}))
        b = imported(on, circuit("B", {2: [7]}))
        activate(on, a)
        activate(on, b)
        assert len(api(on, "GET", "/api/circuits/active").json()) == 2
    finally:
        on.stop()
    off = start(tmp_path, tiny_dirs, sae_dirs, concurrent=False, attach=False)
    try:
        active = api(off, "GET", "/api/circuits/active").json()
        assert [e["name"] for e in active] == ["B"]  # the most recently activated one
        assert [
            (c["layer"], c["circuit_name"])
            for c in api(off, "GET", "/api/circuits/claims").json()["data"]
        ] == [(2, "B")]
        refused = error(
            activate(off, a, allow_layer_overlap="true"), 409, "circuit_concurrency_disabled"
        )
        assert "CIRCUIT_ALLOW_CONCURRENT" in refused["message"]
        assert [e["name"] for e in api(off, "GET", "/api/circuits/active").json()] == ["B"]
        single = api(off, "GET", "/api/circuits/active", params={"single": "true"}).json()
        assert single["circuit"]["name"] == "B" and single["steering"]["mode"] == "full"
    finally:
        off.stop()


def test_the_serving_circuits_dial_is_set_live_and_a_request_in_flight_keeps_its_own(
    server, circuits
):
    a, b = circuits["A"], circuits["B"]
    refused = error(
        api(server, "PUT", "/api/circuits/active/intensity", json={"intensity": 0.5}), 409
    )
    assert refused["code"] == "no_active_circuit"
    activate(server, a)
    activate(server, b)
    ambiguous = error(
        api(server, "PUT", "/api/circuits/active/intensity", json={"intensity": 0.5}), 409
    )
    assert ambiguous["code"] == "ambiguous_active_circuit"
    assert {c["name"] for c in ambiguous["details"]["active_circuits"]} == {"A", "B"}
    api(server, "POST", f"/api/circuits/{b['id']}/deactivate")
    full, _ = chat(server)
    # a long stream in flight while the operator turns the dial down
    body = {"model": MODEL, "messages": USER, "max_tokens": 300, "temperature": 0, "stream": True}
    lines: list[str] = []
    with httpx.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120
    ) as streamed:
        for line in streamed.iter_lines():
            if line:
                lines.append(line)
            if len(lines) == 3:
                turned = api(
                    server, "PUT", "/api/circuits/active/intensity", json={"intensity": 0.5}
                ).json()
    assert turned["reapplied"] is True and turned["superseded"] is False
    assert turned["intensity"] == 0.5
    said = json.loads(lines[-2].removeprefix("data: "))["millm_steering"]
    [(kind, params)] = members(said)
    assert kind == "circuit" and params["intensity"] == "1.0" and params["changed"] is True
    lowered, headers = chat(server)
    assert lowered != full
    assert members(headers["x-millm-steering"])[0][1]["intensity"] == "0.5"
    assert api(server, "GET", f"/api/circuits/{a['id']}").json()["intensity"] == 0.5
    api(server, "PUT", f"/api/circuits/{a['id']}/intensity", json={"intensity": 1.0})
    assert chat(server)[0] == full


PROMPT = "The old river runs to the sea " * 4


def busiest_at(server, layer: int) -> int:
    """The feature of the SAE at `layer` firing at the most positions of PROMPT's completion (not
    one the circuits here steer)."""
    sae = {s["layer"]: s["id"] for s in api(server, "GET", "/api/saes").json()["data"]}[layer]
    return busiest(server, sae, PROMPT, 40, skip=(3, 5, 7, 9, 11, 30, 31))[0][0]


def test_two_circuits_sharing_an_edge_sense_it_each_on_its_own(server, circuits):
    """The same edge in two active circuits: each has its own rings and budget, so one's lag (or
    its budget running out) never changes the other's observations."""
    up, down = busiest_at(server, 0), busiest_at(server, 1)
    edge = {
        "up": {"layer": 0, "feature_idx": up},
        "down": {"layer": 1, "feature_idx": down},
        "rung": 2,
    }
    first = circuit("E1", {0: [30]})
    second = circuit("E2", {2: [31]})
    for doc in (first, second):
        doc["edges"] = [edge]
        declared = {ref["layer"] for ref in doc["saes"]} | {0, 1}  # the edge's layers' SAEs too
        doc["saes"] = [{"layer": layer, "n_features": 128} for layer in sorted(declared)]
    rows = [imported(server, doc) for doc in (first, second)]
    try:
        for row, lag in zip(rows, (1, 8), strict=True):
            assert activate(server, row).status_code == 200
            config = {"theta_floor": 0.05, "max_token_lag": lag, "context_tokens": 0}
            api(server, "PUT", f"/api/circuit-sensing/{row['id']}/config", json=config)
            api(server, "POST", f"/api/circuit-sensing/{row['id']}/enable")
        status = api(server, "GET", "/api/circuit-sensing/status").json()
        key = f"{up}@0->{down}@1"
        assert [c["sensable_edges"] for c in status["armed_circuits"]] == [[key], [key]]
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40}
        answer = api(server, "POST", "/v1/completions", json={**body, "temperature": 0}).json()
        found = api(server, "GET", "/api/circuit-sensing/events", params={"limit": 500}).json()
        mine = [e for e in found["data"] if e["request_id"] == answer["id"]]
        lags = {
            row["name"]: sorted(e["token_lag"] for e in mine if e["circuit"]["id"] == row["id"])
            for row in rows
        }
        assert lags["E2"], "the edge is seen in this row"
        assert all(lag == 1 for lag in lags["E1"]) and set(lags["E1"]) <= set(lags["E2"])
        assert len(lags["E2"]) <= 20 and len(lags["E1"]) <= len(lags["E2"])
    finally:
        api(server, "POST", "/api/circuits/deactivate")
        for row in rows:
            api(server, "DELETE", f"/api/circuits/{row['id']}")
