"""Operators over HTTP on a live server (tiny Llama, a matched SAE attached): the live routes take
op and value, GET /api/steering shows them, save-current writes version 2, profiles import v1 and
v2 and export v2, and a request's own `steering` field steers it alone; every bad op is a clear
400."""

from __future__ import annotations

import json

import pytest
import torch

from millm.interp.steering import FeatureOp
from millm.interp.steering_hash import AppliedSet, steering_set_hash
from tests.api.clients import MODEL, api, error
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens, sae_tensors

USER = [{"role": "user", "content": "Tell me about the city."}]


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    tensors = sae_tensors(64, 128, seed=70)
    tensors["W_enc"] = (
        tensors["W_dec"].T.clone()
        + torch.randn(64, 128, generator=torch.Generator().manual_seed(71)) * 0.05
    )
    return build_saelens(
        tmp_path_factory.mktemp("ops-sae") / "sae",
        layer=1,
        architecture="standard",
        tensors=tensors,
    )


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dir):
    process = ServerProcess(
        tmp_path_factory.mktemp("ops-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        process.wait_ready()
        process.sae = api(process, "POST", "/api/saes", json={"path": str(sae_dir)}).json()["id"]
        assert api(process, "POST", f"/api/saes/{process.sae}/attach").status_code == 200
        yield process
    finally:
        process.stop()


@pytest.fixture
def sae(server):
    api(server, "DELETE", "/api/steering/features")
    api(server, "POST", "/api/steering/enable")
    api(server, "POST", "/api/profiles/deactivate")
    return server.sae


def features_of(view: dict, sae_id: str) -> list[dict]:
    return next(s["features"] for s in view["saes"] if s["sae_id"] == sae_id)


def chat(server, **extra):
    body = {"model": MODEL, "messages": USER, "max_tokens": 8, "temperature": 0, **extra}
    return api(server, "POST", "/v1/chat/completions", json=body)


def read_values(response, index: int) -> list[float]:
    """Feature `index`'s activation at every position the request's read returned."""
    block = response.json()["millm"]["sae_activations"]
    return [
        next(f["value"] for f in entry["features"] if f["index"] == index)
        for entry in block["positions"]
    ]


def test_live_routes_take_ops_and_the_state_shows_them(server, sae):
    v0 = api(server, "GET", "/api/steering").json()["version"]
    one = api(
        server, "PUT", f"/api/steering/saes/{sae}/features/5", json={"op": "clamp", "value": 2.5}
    ).json()
    assert one["live"] is True and one["steering"]["version"] == v0 + 1
    many = api(
        server,
        "POST",
        "/api/steering/features",
        json={
            "features": [
                {"sae_id": sae, "index": 3, "strength": 8},
                {"sae_id": sae, "index": 7, "op": "ablate"},
                {"sae_id": sae, "index": 9, "op": "cap", "value": 1.0},
            ]
        },
    ).json()
    assert features_of(many["steering"], sae) == [
        {"index": 3, "op": "add", "strength": 8.0},
        {"index": 5, "op": "clamp", "value": 2.5},
        {"index": 7, "op": "ablate"},
        {"index": 9, "op": "cap", "value": 1.0},
    ]
    assert features_of(api(server, "GET", "/api/steering").json(), sae) == features_of(
        many["steering"], sae
    )
    # The live clamp steers every request: read back through the SAE at every position.
    steered = chat(server, return_sae_activations={"positions": "all", "features": [5]})
    assert steered.status_code == 200
    assert member(steered.headers["x-millm-steering"])[0] == "manual"
    assert max(abs(v - 2.5) for v in read_values(steered, 5)) < 1e-4
    # an add of 0 clears, as before
    api(server, "PUT", f"/api/steering/saes/{sae}/features/5", json={"strength": 0})
    assert [f["index"] for f in features_of(api(server, "GET", "/api/steering").json(), sae)] == [
        3,
        7,
        9,
    ]


@pytest.mark.parametrize(
    "body, param, needle",
    [
        ({"op": "clamp"}, "value", "op clamp needs value"),
        ({"op": "cap"}, "value", "op cap needs value"),
        ({"op": "add", "value": 3}, "value", "value is for op clamp and cap only"),
        ({"value": 3}, "value", "value is for op clamp and cap only"),
        ({}, "strength", "op add needs strength"),
        ({"op": "clamp", "value": -1}, "value", "value must be a finite number >= 0, got -1"),
        ({"op": "clamp", "value": 2, "strength": 4}, "strength", "strength is for op add only"),
        ({"op": "ablate", "value": 0}, "value", "value is for op clamp and cap only"),
        (
            {"op": "squash", "value": 1},
            "op",
            "op: Input should be 'add', 'clamp', 'ablate' or 'cap'",
        ),
        ({"strength": 250}, "strength", "±200"),
    ],
)
def test_bad_ops_are_refused_and_nothing_changes(server, sae, body, param, needle):
    before = api(server, "GET", "/api/steering").json()
    refused = error(api(server, "PUT", f"/api/steering/saes/{sae}/features/5", json=body), 400)
    assert refused["param"] == param and needle in refused["message"], refused
    assert api(server, "GET", "/api/steering").json()["version"] == before["version"]


def test_an_op_past_the_width_and_a_bad_entry_among_many_change_nothing(server, sae):
    before = api(server, "GET", "/api/steering").json()["version"]
    error(
        api(server, "PUT", f"/api/steering/saes/{sae}/features/128", json={"op": "ablate"}),
        400,
        "invalid_feature_index",
    )
    refused = error(
        api(
            server,
            "POST",
            "/api/steering/features",
            json={
                "features": [
                    {"sae_id": sae, "index": 1, "op": "clamp", "value": 1},
                    {"sae_id": sae, "index": 2, "op": "clamp"},
                ]
            },
        ),
        400,
    )
    assert refused["param"] == "features[1].value"
    assert api(server, "GET", "/api/steering").json()["version"] == before


def test_save_current_writes_a_version_2_profile_that_steers_the_same(server, sae):
    api(
        server,
        "POST",
        "/api/steering/features",
        json={
            "features": [
                {"sae_id": sae, "index": 3, "strength": 6},
                {"sae_id": sae, "index": 5, "op": "clamp", "value": 1.5},
            ]
        },
    )
    live = chat(server)
    saved = api(server, "POST", "/api/profiles/save-current", json={"name": "ops-saved"})
    assert saved.status_code == 201, saved.text
    document = api(server, "GET", "/api/profiles/ops-saved/export").json()
    assert document["version"] == 2 and document["steering"] == [
        {
            "sae_id": sae,
            "layer": 1,
            "features": [
                {"index": 3, "op": "add", "strength": 6.0},
                {"index": 5, "op": "clamp", "value": 1.5},
            ],
        }
    ]
    api(server, "DELETE", "/api/steering/features")
    assert (
        chat(server, profile="ops-saved").json()["choices"][0]["message"]["content"]
        == live.json()["choices"][0]["message"]["content"]
    )


def test_profiles_import_version_1_and_2_and_export_version_2(server, sae):
    v1 = {
        "kind": "millm.profile",
        "version": 1,
        "name": "ops-v1",
        "steering": [{"sae_id": sae, "features": [{"index": 3, "strength": 6.0}]}],
    }
    v2 = {
        "kind": "millm.profile",
        "version": 2,
        "name": "ops-v2",
        "steering": [{"sae_id": sae, "features": [{"index": 4, "op": "ablate"}]}],
        "abort": [{"probe": "nobody"}],
    }
    imported = api(
        server,
        "POST",
        "/api/profiles/import",
        json={"kind": "millm.profile-bundle", "version": 1, "profiles": [v1, v2]},
    )
    assert imported.status_code == 201, imported.text
    exported = {p["name"]: p for p in api(server, "GET", "/api/profiles/export").json()["profiles"]}
    assert exported["ops-v1"]["version"] == 2 and exported["ops-v1"]["steering"][0]["features"] == [
        {"index": 3, "op": "add", "strength": 6.0}
    ]
    assert exported["ops-v2"]["abort"] == [{"probe": "nobody"}]
    # A probe no book knows refuses the request naming the entry (this server keeps no probes yet).
    refused = error(chat(server, profile="ops-v2"), 400, "probe_not_found")
    assert (
        refused["message"] == "profile 'ops-v2': abort[0]: no probe is named 'nobody'"
        and refused["param"] == "profile"
    )
    bad = error(
        api(
            server,
            "POST",
            "/api/profiles",
            json={
                "name": "ops-bad",
                "steering": [{"sae_id": sae, "features": [{"index": 1, "op": "clamp"}]}],
            },
        ),
        400,
    )
    assert "value" in bad["message"]
    created = api(
        server,
        "POST",
        "/api/profiles",
        json={
            "name": "ops-created",
            "steering": [{"sae_id": sae, "features": [{"index": 1, "op": "cap", "value": 2}]}],
        },
    )
    assert created.status_code == 201 and created.json()["document"]["steering"][0]["features"] == [
        {"index": 1, "op": "cap", "value": 2.0}
    ]


def test_a_requests_own_steering_steers_it_alone(server, sae):
    # a live value the request replaces
    api(server, "PUT", f"/api/steering/saes/{sae}/features/3", json={"strength": 40})
    version = api(server, "GET", "/api/steering").json()["version"]
    spec = {
        "steering": [
            {
                "sae_id": sae,
                "features": [
                    {"index": 5, "op": "clamp", "value": 3.0},
                    {"index": 6, "strength": 10},
                ],
            }
        ]
    }
    own = chat(server, steering=spec, return_sae_activations={"positions": "all", "features": [5]})
    assert own.status_code == 200, own.text
    # an inline member; a clamp hashes apart from an add of the same number
    kind, params = member(own.headers["x-millm-steering"])
    assert (kind, params["sae"], params["features"]) == ("inline", sae, 2)
    clamp_and_add = AppliedSet(
        sae, params["layer"], ((5, FeatureOp("clamp", value=3.0)), (6, FeatureOp("add", 10.0)))
    )
    assert params["hash"] == clamp_and_add.hash != steering_set_hash(sae, [(5, 3.0), (6, 10.0)])
    assert max(abs(v - 3.0) for v in read_values(own, 5)) < 1e-4
    # the global state is untouched
    assert api(server, "GET", "/api/steering").json()["version"] == version
    # Text completions take it too; the dial scales its adds only.
    text = api(
        server,
        "POST",
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "The river",
            "max_tokens": 6,
            "temperature": 0,
            "steering": spec,
            "return_sae_activations": {"positions": "all", "features": [5]},
        },
    )
    assert text.status_code == 200 and max(abs(v - 3.0) for v in read_values(text, 5)) < 1e-4
    dialled = chat(server, steering=spec, steering_intensity=0.5)
    assert dialled.status_code == 200 and dialled.headers["x-millm-steering-intensity"] == "0.5"
    same = chat(server, steering=json.loads(json.dumps(spec)))
    assert (
        same.json()["choices"][0]["message"]["content"]
        == own.json()["choices"][0]["message"]["content"]
    )


@pytest.mark.parametrize(
    "extra, status, code, param",
    [
        ({"steering": {"steering": []}, "profile": "x"}, 400, "invalid_parameter", "steering"),
        (  # scoring mode (logprobs, one token) is never steered
            {"steering": {"steering": []}, "logprobs": True, "max_tokens": 1},
            400,
            "field_not_honoured",
            "steering",
        ),
        (
            {
                "steering": {
                    "steering": [{"sae_id": "SAE", "features": [{"index": 5, "op": "clamp"}]}]
                }
            },
            400,
            "invalid_parameter",
            "steering.steering[0].features[0].value",
        ),
        (
            {
                "steering": {
                    "steering": [
                        {"sae_id": "SAE", "features": [{"index": 5, "op": "boost", "value": 1}]}
                    ]
                }
            },
            400,
            "invalid_parameter",
            "steering.steering[0].features[0]",
        ),
        (
            {
                "steering": {
                    "steering": [{"sae_id": "SAE", "features": [{"index": 500, "op": "ablate"}]}]
                }
            },
            400,
            "invalid_feature_index",
            "steering",
        ),
        (
            {"steering": {"steering": [{"sae_id": "sae_000000000000", "features": []}]}},
            400,
            "sae_not_attached",
            "steering",
        ),
        ({"steering": {"abort": [{"probe": "nobody"}]}}, 400, "probe_not_found", "steering"),
        (
            {"steering": {"vectors": [{"vector_id": "vec_nobody", "strength": 2}]}},
            400,
            "vector_not_found",
            "steering",
        ),
        ({"steering": [1, 2]}, 400, "invalid_parameter", "steering"),
    ],
)
def test_a_bad_own_steering_is_refused_naming_the_field(server, sae, extra, status, code, param):
    body = json.loads(json.dumps(extra).replace('"SAE"', json.dumps(sae)))
    refused = error(chat(server, **body), status, code)
    assert refused["param"] == param, refused


def test_embeddings_refuse_steering(server, sae):
    refused = error(
        api(
            server,
            "POST",
            "/v1/embeddings",
            json={"model": MODEL, "input": "hi", "steering": {"steering": []}},
        ),
        400,
        "field_not_honoured",
    )
    assert refused["param"] == "steering"


def test_the_served_schema_states_the_field_and_the_ops(server):
    schema = api(server, "GET", "/openapi.json").json()
    chat_request = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat_request["properties"]["steering"]["anyOf"] == [
        {"$ref": "#/components/schemas/RequestSteering"},
        {"$ref": "#/components/schemas/InlineSteering"},
        {"type": "null"},
    ]
    assert "not with profile" in chat_request["properties"]["steering"]["description"]
    features = schema["components"]["schemas"]["ProfileDocumentEntry"]["properties"]["features"][
        "items"
    ]["oneOf"]
    assert [ref["$ref"].rsplit("/", 1)[-1] for ref in features] == [
        "FeatureAdd",
        "FeatureClamp",
        "FeatureAblate",
        "FeatureCap",
    ]
