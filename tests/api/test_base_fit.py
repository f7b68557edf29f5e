"""No silent unsteering: an active profile or cluster that stops fitting the attached SAEs refuses
generation requests (400 invalid_feature_index naming it) instead of serving them unsteered, and
the routes that change SAEs say so."""

import pytest

from tests.api.clients import MODEL, api, error, sse_events
from tests.support.mistudio_docs import cluster, raw
from tests.support.server import ServerProcess
from tests.support.steering_header import member, members
from tests.support.tiny_saes import build_saelens

USER = [{"role": "user", "content": "Tell me about the harbour."}]


@pytest.fixture(scope="module")
def saes(tmp_path_factory):
    base = tmp_path_factory.mktemp("fit-saes")
    return {
        1: build_saelens(base / "l1", layer=1, seed=21),
        2: build_saelens(base / "l2", layer=2, seed=22),
        "narrow": build_saelens(base / "narrow", layer=2, d_sae=64, seed=23),
    }


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, saes):
    process = ServerProcess(
        tmp_path_factory.mktemp("fit-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        process.wait_ready()
        process.ids = {
            key: api(process, "POST", "/api/saes", json={"path": str(path)}).json()["id"]
            for key, path in saes.items()
        }
        for key in (1, 2):
            api(process, "POST", f"/api/saes/{process.ids[key]}/attach")
        yield process
    finally:
        process.stop()


def chat(server, **extra):
    return api(
        server,
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 6, "temperature": 0, **extra},
    )


def test_an_active_profile_that_stops_fitting_refuses_requests(server):
    one, two = server.ids[1], server.ids[2]
    profile = api(
        server,
        "POST",
        "/api/profiles",
        json={
            "name": "two-saes",
            "steering": [
                {"sae_id": one, "layer": 1, "features": [{"index": 3, "strength": 30}]},
                {"sae_id": two, "layer": 2, "features": [{"index": 5, "strength": 30}]},
            ],
        },
    ).json()
    api(server, "POST", f"/api/profiles/{profile['id']}/activate")
    steered = chat(server)
    assert steered.status_code == 200
    said = members(steered.headers["x-millm-steering"])
    assert [(kind, p["name"], p["source"]) for kind, p in said] == [
        ("profile", "two-saes", "active"),
        ("profile", "two-saes", "active"),
    ]

    detached = api(server, "POST", f"/api/saes/{two}/detach").json()
    assert (
        detached["active_base"]["name"] == "two-saes" and detached["active_base"]["fits"] is False
    )
    assert two in detached["active_base"]["problem"]
    body = error(chat(server), 400, "invalid_feature_index")
    assert (
        "'two-saes'" in body["message"]
        and two in body["message"]
        and "deactivate" in body["message"]
    )
    streamed = chat(server, stream=True)  # refused before the stream starts: a 400, not an SSE body
    assert streamed.headers["content-type"].startswith("application/json")
    error(streamed, 400, "invalid_feature_index")
    assert api(server, "GET", "/api/steering").json()["active_base"]["fits"] is False

    # Nothing that is never steered is refused, nor a request that turns steering off.
    assert chat(server, steering_intensity="off").headers["x-millm-steering"].startswith("none")
    assert chat(server, logprobs=True, max_tokens=1).status_code == 200
    assert (
        api(server, "POST", "/v1/embeddings", json={"model": MODEL, "input": "harbour"}).status_code
        == 200
    )
    api(server, "POST", "/api/steering/disable")
    assert chat(server).headers["x-millm-steering"] == "none"
    api(server, "POST", "/api/steering/enable")

    reattached = api(server, "POST", f"/api/saes/{two}/attach").json()
    assert reattached["active_base"]["fits"] is True
    again = chat(server)
    assert (
        again.status_code == 200
        and again.json()["choices"][0]["message"]["content"]
        == steered.json()["choices"][0]["message"]["content"]
    )
    api(server, "POST", "/api/profiles/deactivate")


def test_a_cluster_whose_sae_was_replaced_refuses_requests(server):
    two, narrow = server.ids[2], server.ids["narrow"]
    created = api(
        server,
        "POST",
        "/api/clusters/import",
        content=raw(cluster(name="harbour", layer=2)),
        headers={"content-type": "application/json"},
    )
    row = created.json()["data"][0]
    api(server, "POST", f"/api/clusters/{row['id']}/activate")
    kind, params = member(chat(server).headers["x-millm-steering"])
    assert kind == "profile" and params["name"] == "harbour" and params["base"] == "cluster"
    api(server, "POST", f"/api/saes/{two}/detach")
    swapped = api(
        server, "POST", f"/api/saes/{narrow}/attach"
    ).json()  # another width at the same layer
    assert (
        swapped["active_base"]["fits"] is False
        and "n_features 128" in swapped["active_base"]["problem"]
    )
    body = error(chat(server, stream=True), 400, "invalid_feature_index")
    assert "'harbour'" in body["message"]
    api(server, "POST", f"/api/saes/{narrow}/detach")
    assert api(server, "POST", f"/api/saes/{two}/attach").json()["active_base"]["fits"] is True
    assert chat(server).status_code == 200
    assert api(server, "POST", "/api/clusters/deactivate").json()["deactivated"] == row["id"]
    assert chat(server).headers["x-millm-steering"] == "none"


def test_streams_are_checked_before_the_first_byte(server):
    # Served while it fits; the plan is immutable, so a change after admission never reaches a
    # running stream.
    events = sse_events(chat(server, stream=True).text)
    assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1])
