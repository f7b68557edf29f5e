"""/mcp on a live server, through the MCP SDK's own client (streamable HTTP + ClientSession): the
tools and their schemas, each tool answering as its route does, a feature steered over MCP
changing the next chat completion and cleared again, compare, profiles, monitoring, refusals as
tool errors in millm's shape, and the admin key in front of it all."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.api.clients import MODEL, api, error
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens

ADMIN_KEY = "sk-test-admin-mcp-4c1d"
MESSAGES = [{"role": "user", "content": "Tell me about the river."}]
PARIS = (
    10  # build_saelens labels every tenth feature "feature N paris", the others "feature N river"
)
STRENGTH = 150.0
TOOLS = {
    "list_saes",
    "search_features",
    "get_feature",
    "inspect_text",
    "contrast_texts",
    "get_steering",
    "set_feature",
    "clear_feature",
    "clear_steering",
    "list_profiles",
    "activate_profile",
    "deactivate_profile",
    "compare",
    "monitoring_stats",
    "logit_lens",
    "attribution_graph",
    "start_attribution_job",
    "get_attribution_graph",
    "list_variants",
    "create_variant",
    "delete_variant",
    "label_top_tokens",
    "explain_features",
    "train_dictionary",
    "get_training",
    "grade_dictionary",
    "dictionary_grades",
    "grade_transcoder_set",
    "transcoder_set_grades",
    "get_job",
    "list_batches",
    "get_batch",
    "sensing_status",
    "sensing_events",
    "enable_sensing",
    "circuit_sensing_status",
    "circuit_sensing_events",
    "enable_circuit_sensing",
    "circuit_claims",
}


def bearer(key: str | None = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def rest(server, method: str, path: str, **kwargs) -> httpx.Response:
    """The same operation over HTTP, with the admin key (reads need a key too while one is set)."""
    return api(server, method, path, headers=bearer(), **kwargs)


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    """The tiny Llama in float32 (greedy answers are exact) behind an admin key, one SAE
    attached, one profile saved."""
    process = ServerProcess(
        tmp_path_factory.mktemp("mcp-home"),
        ["--model", str(tiny_dirs["llama"]), "--dtype", "float32"],
        env={"MILLM_ADMIN_KEY": ADMIN_KEY},
    )
    try:
        process.wait_ready()
        sae_dir = build_saelens(tmp_path_factory.mktemp("mcp-sae") / "sae", layer=1, seed=5)
        process.sae = rest(process, "POST", "/api/saes", json={"path": str(sae_dir)}).json()["id"]
        assert rest(process, "POST", f"/api/saes/{process.sae}/attach").status_code == 200
        profile = {
            "name": "paris-push",
            "steering": [
                {
                    "sae_id": process.sae,
                    "layer": 1,
                    "features": [{"index": PARIS, "strength": STRENGTH}],
                }
            ],
        }
        assert rest(process, "POST", "/api/profiles", json=profile).status_code == 201
        yield process
    finally:
        process.stop()


@pytest.fixture
def sae(server):
    """The attached SAE's id, with no live values and no active profile."""
    assert rest(server, "DELETE", "/api/steering/features").status_code == 200
    assert rest(server, "POST", "/api/profiles/deactivate").status_code == 200
    return server.sae


def session(
    server, work: Callable[[ClientSession], Awaitable[Any]], key: str | None = ADMIN_KEY
) -> Any:
    """`work` run on one MCP session with the server (the SDK's client, as an agent connects)."""

    async def run():
        http = httpx2.AsyncClient(headers=bearer(key), timeout=httpx2.Timeout(30, read=120))
        async with (
            http,
            streamable_http_client(f"{server.base_url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            return await work(mcp)

    return asyncio.run(run())


def call(server, tool: str, **arguments) -> Any:
    """One tool's result (which must not be an error) as the JSON it carries."""
    result = session(server, lambda mcp: mcp.call_tool(tool, arguments))
    assert not result.is_error, result.content
    return answer(result)


def answer(result) -> Any:
    [content] = result.content
    payload = json.loads(content.text)
    assert result.structured_content == payload
    return payload


def refused(server, tool: str, status: int, code: str, **arguments) -> dict:
    """The error object of a tool call that must fail with this status and code."""
    result = session(server, lambda mcp: mcp.call_tool(tool, arguments))
    assert result.is_error, result.content
    payload = answer(result)
    assert payload["status"] == status and payload["error"]["code"] == code, payload
    return payload["error"]


def chat(server, **extra) -> tuple[str, str]:
    """A greedy chat completion's text and its X-miLLM-Steering header."""
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 8,
        "temperature": 0,
        "seed": 3,
        **extra,
    }
    response = rest(server, "POST", "/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], response.headers["x-millm-steering"]


def test_tools_are_listed_with_their_routes_schemas(server):
    listed = session(server, lambda mcp: mcp.list_tools()).tools
    assert {tool.name for tool in listed} == TOOLS
    tools = {tool.name: tool for tool in listed}
    for tool in listed:
        assert (
            tool.description
            and tool.input_schema["type"] == "object"
            and tool.input_schema["additionalProperties"] is False
        )
        # every reference resolves inside the schema
        assert "#/components" not in json.dumps(tool.input_schema)
    inspect = tools["inspect_text"].input_schema
    assert inspect["required"] == ["sae_id"] and {
        "text",
        "messages",
        "top_k",
        "sort",
        "feature",
        "steering",
    } <= set(inspect["properties"])
    assert inspect["properties"]["top_k"]["maximum"] == 256 and inspect["oneOf"] == [
        {"required": ["text"]},
        {"required": ["messages"]},
    ]
    assert {"DiscoveryMessage", "SteerWith"} <= set(inspect["$defs"])
    steer = tools["set_feature"].input_schema
    assert (
        steer["required"] == ["sae_id", "index"]
        and steer["properties"]["strength"]["anyOf"][0]["maximum"] == 200
    )
    compare = tools["compare"].input_schema
    assert "stream" not in compare["properties"] and compare["required"] == ["messages"]
    limit = tools["search_features"].input_schema["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"], limit["default"]) == (
        "integer",
        1,
        1000,
        50,
    )
    assert tools["get_steering"].input_schema["properties"] == {}
    assert (
        tools["search_features"].annotations.read_only_hint
        and not tools["set_feature"].annotations.read_only_hint
    )


def test_reads_answer_as_their_routes(server, sae):
    found = call(server, "search_features", sae_id=sae, q="paris", limit=5)
    assert (
        found
        == rest(
            server, "GET", f"/api/saes/{sae}/features", params={"q": "paris", "limit": 5}
        ).json()
    )
    assert [hit["index"] % 10 for hit in found["data"]] == [0] * 5 and all(
        "paris" in hit["label"] for hit in found["data"]
    )
    assert call(server, "list_saes")["data"][0]["id"] == sae
    detail = call(server, "get_feature", sae_id=sae, index=PARIS, k=3)
    assert (
        detail == rest(server, "GET", f"/api/saes/{sae}/features/{PARIS}", params={"k": 3}).json()
    )
    inspected = call(
        server,
        "inspect_text",
        sae_id=sae,
        text="The river runs through Paris.",
        top_k=4,
        feature=PARIS,
    )
    assert (
        inspected
        == rest(
            server,
            "POST",
            f"/api/saes/{sae}/inspect",
            json={"text": "The river runs through Paris.", "top_k": 4, "feature": PARIS},
        ).json()
    )
    assert (
        inspected["object"] == "sae.inspect"
        and len(inspected["features"]) == 4
        and inspected["activations"]["index"] == PARIS
    )
    sets = {
        "a": {"texts": ["Paris in spring.", "The Seine at night."]},
        "b": {"texts": ["A list of numbers.", "Seven, eight, nine."]},
        "top_k": 3,
    }
    contrast = call(server, "contrast_texts", sae_id=sae, **sets)
    assert contrast == rest(server, "POST", f"/api/saes/{sae}/contrast", json=sets).json()
    lensed = call(server, "logit_lens", text="The river runs", positions="last", top_k=2)
    assert (
        lensed
        == rest(
            server,
            "POST",
            "/api/lens",
            json={"text": "The river runs", "positions": "last", "top_k": 2},
        ).json()
    )
    assert lensed["object"] == "lens" and len(lensed["predictions"]) == 1
    asked = {"text": "The river runs", "max_feature_nodes": 8, "verify": 2}
    traced = call(server, "attribution_graph", **asked)
    direct = rest(server, "POST", "/api/attribution", json=asked).json()
    assert traced["object"] == "attribution_graph" and traced["id"] != direct["id"]
    for answer in (traced, direct):  # two computations of one graph: the same but for id and time
        answer.pop("id"), answer.pop("seconds")
    assert traced == direct


def test_a_feature_set_over_mcp_steers_the_next_completion_until_cleared(server, sae):
    plain, header = chat(server)
    assert header == "none"
    changed = call(server, "set_feature", sae_id=sae, index=PARIS, strength=STRENGTH)
    assert changed["live"] is True
    version = changed["steering"]["version"]
    seen = call(server, "get_steering")
    assert seen == rest(server, "GET", "/api/steering").json()
    assert [(s["sae_id"], s["features"]) for s in seen["saes"]] == [
        (sae, [{"index": PARIS, "op": "add", "strength": STRENGTH}])
    ]
    steered, header = chat(server)
    assert member(header)[1]["version"] == version and steered != plain
    # Read through the SAE, the live steering is exactly the feature at its strength, and not the
    # unsteered model.
    text = {"sae_id": sae, "text": "Tell me about the river.", "feature": PARIS, "top_k": 3}
    values = lambda steering: [
        v["value"]
        for v in call(server, "inspect_text", **text, steering=steering)["activations"]["values"]
    ]
    live_read = values("live")
    assert live_read == values(
        {"features": [{"index": PARIS, "strength": STRENGTH}]}
    ) and live_read != values(None)
    compared = call(server, "compare", messages=MESSAGES, max_tokens=8, temperature=0, seed=3)
    unsteered, live = compared["variants"]
    assert (unsteered["label"], unsteered["steering"]["kind"], unsteered["text"]) == (
        "unsteered",
        "none",
        plain,
    )
    assert (live["label"], live["steering"]["kind"], live["text"]) == ("live", "live", steered)
    cleared = call(server, "clear_feature", sae_id=sae, index=PARIS)
    assert cleared["steering"]["version"] == version + 1 and all(
        not s["features"] for s in cleared["steering"]["saes"]
    )
    assert chat(server) == (plain, "none")


def test_compare_reports_what_its_route_sends_as_headers(server, sae):
    result = session(
        server,
        lambda mcp: mcp.call_tool(
            "compare",
            {"messages": MESSAGES, "max_tokens": 4, "seed": 11, "variants": ["unsteered"]},
        ),
    )
    assert not result.is_error and [v["label"] for v in answer(result)["variants"]] == ["unsteered"]
    assert (
        result.meta["X-miLLM-Seed"] == '11;scope="batch-shape"'
        and result.meta["X-miLLM-Steering"] == "compare;variants=1"
    )


def test_clear_steering_and_profiles(server, sae):
    call(server, "set_feature", sae_id=sae, index=3, strength=5.0)
    call(server, "set_feature", sae_id=sae, index=4, op="ablate")
    assert all(not s["features"] for s in call(server, "clear_steering")["steering"]["saes"])
    profiles = call(server, "list_profiles")
    assert profiles == rest(server, "GET", "/api/profiles").json()
    assert [(p["name"], p["active"]) for p in profiles["data"]] == [("paris-push", False)]
    activated = call(server, "activate_profile", key="paris-push")
    assert activated["profile"]["name"] == "paris-push" and activated["live"] is True
    assert call(server, "get_steering")["active_profile"]["name"] == "paris-push"
    assert chat(server)[1].startswith('profile;name="paris-push"')
    assert call(server, "deactivate_profile")["deactivated"]
    assert call(server, "get_steering")["active_profile"] is None and chat(server)[1] == "none"


def test_a_variant_made_over_mcp_is_a_model_every_client_can_name(server, sae):
    steering = {
        "steering": [
            {"sae_id": sae, "layer": 1, "features": [{"index": PARIS, "strength": STRENGTH}]}
        ]
    }
    made = call(server, "create_variant", name="mcp-paris", base=MODEL, steering=steering)
    assert made["name"] == "mcp-paris" and made["fits"] is True
    try:
        assert [v["name"] for v in call(server, "list_variants")["data"]] == ["mcp-paris"]
        listed = rest(server, "GET", "/v1/models").json()["data"]
        assert [card["parent"] for card in listed if card["id"] == "mcp-paris"] == [MODEL]
        text, steered = chat(server, model="mcp-paris")
        assert (text, steered.split(";")[0]) == (chat(server, steering=steering)[0], "inline")
        refused(
            server, "create_variant", 400, "unknown_base", name="x", base="none", steering=steering
        )
    finally:
        gone = call(server, "delete_variant", key="mcp-paris")
    assert gone["deleted"] is True and call(server, "list_variants")["data"] == []


def test_monitoring_stats(server, sae):
    assert (
        rest(server, "PUT", "/api/monitoring", json={"enabled": True, "sae_id": sae}).status_code
        == 200
    )
    try:
        chat(server, max_tokens=2)
        deadline = time.monotonic() + 30
        while (stats := call(server, "monitoring_stats"))[
            "requests"
        ] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stats == rest(server, "GET", "/api/monitoring/stats").json()
        assert stats["requests"] == 1 and stats["positions_read"] > 0 and stats["features"]
    finally:
        rest(server, "PUT", "/api/monitoring", json={"enabled": False})


def test_refusals_are_tool_errors_in_the_routes_shape(server, sae):
    over = refused(
        server, "set_feature", 400, "invalid_parameter", sae_id=sae, index=3, strength=500
    )
    http = error(
        rest(server, "PUT", f"/api/steering/saes/{sae}/features/3", json={"strength": 500}), 400
    )
    assert over == http and "±200" in over["message"]
    refused(server, "set_feature", 400, "invalid_feature_index", sae_id=sae, index=128, strength=1)
    refused(server, "set_feature", 404, "sae_not_found", sae_id="sae_nope", index=1, strength=1)
    typo = refused(server, "set_feature", 400, "invalid_parameter", sae_id=sae, index=1, strenght=1)
    assert typo == error(
        rest(server, "PUT", f"/api/steering/saes/{sae}/features/1", json={"strenght": 1}), 400
    )
    assert typo["param"] == "strenght"
    both = refused(
        server, "inspect_text", 400, "invalid_parameter", sae_id=sae, text="x", messages=MESSAGES
    )
    assert "give either text or messages" in both["message"]
    refused(server, "inspect_text", 404, "sae_not_found", sae_id="sae_nope", text="x")
    refused(server, "activate_profile", 404, "profile_not_found", key="nobody")
    assert (
        refused(server, "compare", 400, "invalid_parameter", messages=MESSAGES, stream=True)[
            "param"
        ]
        == "stream"
    )
    assert (
        refused(server, "search_features", 400, "invalid_parameter", sae_id=sae, limit=0)["param"]
        == "limit"
    )
    refused(server, "no_such_tool", 404, "tool_not_found")
    # nothing refused changed anything
    assert all(not s["features"] for s in call(server, "get_steering")["saes"])

    async def errors_then_more(mcp: ClientSession):
        first = await mcp.call_tool(
            "set_feature", {"sae_id": "sae_nope", "index": 1, "strength": 1}
        )
        return first, await mcp.list_tools()

    first, listed = session(server, errors_then_more)  # a refusal leaves the session usable
    assert first.is_error and len(listed.tools) == len(TOOLS)


def test_labelling_and_explaining_over_mcp(server, sae):
    texts = ["The river runs to the sea.", "A small cat sat on the mat by the river."]
    uncalibrated = refused(
        server, "explain_features", 400, "sae_not_calibrated", sae_id=sae, features=[1]
    )
    assert uncalibrated["param"] == "sae_id"
    calibrating = rest(server, "POST", f"/api/saes/{sae}/calibrate", json={"texts": texts})
    assert calibrating.status_code == 202, calibrating.text
    while call(server, "get_job", job_id=calibrating.json()["id"])["state"] == "running":
        time.sleep(0.1)
    # every feature has its file's label, so top tokens label none of them unless asked to
    labels = rest(server, "GET", f"/api/saes/{sae}/labels").json()
    kept = call(server, "label_top_tokens", sae_id=sae)
    assert (kept["source"], kept["imported"], kept["total"]) == ("top_tokens", 0, len(labels))
    assert rest(server, "GET", f"/api/saes/{sae}/labels").json() == labels
    started = call(server, "explain_features", sae_id=sae, densest=2, width=8, answer_start=False)
    assert started["kind"] == "explain" and started["state"] == "running"
    while (job := call(server, "get_job", job_id=started["id"]))["state"] == "running":
        time.sleep(0.1)
    assert job == rest(server, "GET", f"/api/jobs/{started['id']}").json()
    # The tiny random model writes no [EXPLANATION]: line: both features are listed, none stored,
    # and a job that wrote nothing failed.
    assert job["state"] == "failed" and job["error"]["code"] == "nothing_explained"
    assert job["result"]["explained"] == 0
    assert [s["reason"] for s in job["result"]["skipped"]] == [
        "the explainer's answer has no [EXPLANATION]: line"
    ] * 2
    refused(server, "get_job", 404, "job_not_found", job_id="job_nope")


def test_the_admin_key_opens_mcp(server, sae):
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    headers = {"accept": "application/json, text/event-stream"}
    for key in (None, "sk-wrong"):
        response = httpx.post(
            f"{server.base_url}/mcp",
            json=initialize,
            headers={**headers, **bearer(key)},
            timeout=30,
        )
        body = error(response, 401, "invalid_api_key", "invalid_request_error")
        assert response.headers["www-authenticate"] == 'Bearer realm="millm"' and (
            key is not None or "MILLM_ADMIN_KEY" in body["message"]
        )
    with pytest.raises(
        BaseExceptionGroup
    ) as failed:  # the SDK's client, refused, cannot even initialise
        session(server, lambda mcp: mcp.list_tools(), key=None)
    assert failed.group_contains(MCPError, depth=2)
    cross = httpx.post(
        f"{server.base_url}/mcp",
        json=initialize,
        headers={**headers, **bearer(), "origin": "https://evil.example"},
        timeout=30,
    )
    error(cross, 403, "cross_site_request")
    opened = httpx.post(
        f"{server.base_url}/mcp", json=initialize, headers={**headers, **bearer()}, timeout=30
    )
    assert opened.status_code == 200 and opened.json()["result"]["serverInfo"]["name"] == "millm"
    # Stateless: no stream to open and no session to end.
    for method in ("GET", "DELETE"):
        response = httpx.request(
            method, f"{server.base_url}/mcp", headers={**headers, **bearer()}, timeout=30
        )
        assert error(response, 405, "method_not_allowed") and response.headers["allow"] == "POST"


def test_an_attribution_job_over_mcp_names_the_graph_get_attribution_graph_returns(server, sae):
    body = {"text": "The capital of France is", "max_feature_nodes": 16, "verify": 2}
    started = call(server, "start_attribution_job", **body)
    assert started["kind"] == "attribution" and started["progress"]["unit"] == "features"
    while (job := call(server, "get_job", job_id=started["id"]))["state"] == "running":
        time.sleep(0.1)
    assert job["state"] == "succeeded", job
    graph = call(server, "get_attribution_graph", graph_id=job["result"]["graph_id"])
    assert graph == rest(server, "GET", f"/api/attribution/{graph['id']}").json()
    assert graph["expanded_features"] == job["result"]["expanded_features"]
    refused(server, "get_attribution_graph", 404, "graph_not_found", graph_id="graph-nope")


def test_a_batch_is_followed_through_the_tools(server):
    line = {"custom_id": "m1", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": "The river", "max_tokens": 2}}  # fmt: skip
    headers = bearer()
    stored = httpx.post(
        f"{server.base_url}/v1/files",
        files={"file": ("m.jsonl", (json.dumps(line) + "\n").encode())},
        data={"purpose": "batch"},
        headers=headers,
    ).json()
    made = httpx.post(
        f"{server.base_url}/v1/batches",
        json={
            "input_file_id": stored["id"],
            "endpoint": "/v1/completions",
            "completion_window": "24h",
        },  # fmt: skip
        headers=headers,
    ).json()
    assert made["id"] in [b["id"] for b in call(server, "list_batches")["data"]]
    deadline = time.monotonic() + 60
    while (got := call(server, "get_batch", batch_id=made["id"]))["status"] != "completed":
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    assert got["request_counts"] == {"total": 1, "completed": 1, "failed": 0}


def test_sensing_is_read_and_switched_over_mcp_as_over_http(server):
    """The sensing tools answer what their routes answer (tests/api/test_sensing_api.py covers
    what sensing records)."""
    for tool, path in (
        ("sensing_status", "/api/sensing/status"),
        ("circuit_sensing_status", "/api/circuit-sensing/status"),
    ):
        status = call(server, tool)
        over_http = rest(server, "GET", path).json()
        assert status == over_http and status["armed"] is False
    listed = call(server, "sensing_events", limit=5)
    assert listed == {"object": "list", "data": [], "total": 0}
    assert call(server, "circuit_sensing_events", edge_key="1@1->2@2")["total"] == 0
    refused(server, "enable_sensing", 404, "cluster_not_found", cluster_id="no-such-cluster")
    refused(server, "enable_circuit_sensing", 404, "circuit_not_found", circuit_id="nope")
    assert call(server, "circuit_claims") == rest(server, "GET", "/api/circuits/claims").json()


def test_a_dictionary_is_trained_and_graded_through_the_tools(server, sae):
    texts = [
        f"The river runs past mill {i} to the sea, and the boats go with it." for i in range(60)
    ]
    body = {"name": "mcp-sae", "layer": 1, "d_sae": 32, "k": 4, "training_tokens": 1024,
            "batch_tokens": 128, "corpus": {"texts": texts, "context_size": 32}}  # fmt: skip
    started = call(server, "train_dictionary", **body)
    assert started["object"] == "dictionary_training" and started["state"] == "running"
    deadline = time.monotonic() + 120
    while (view := call(server, "get_training", training_id=started["id"]))["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert view["state"] == "succeeded" and view["progress"]["steps"] == 8
    assert view == rest(server, "GET", f"/api/saes/trainings/{started['id']}").json()
    trained = view["result"]["sae_id"]
    assert call(server, "dictionary_grades", sae_id=trained)["data"] == []  # not attached
    job = call(server, "grade_dictionary", sae_id=sae, corpus={"texts": texts[:3]})
    assert job["kind"] == "dictionary-grade"
    while (job := call(server, "get_job", job_id=job["id"]))["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert call(server, "dictionary_grades", sae_id=sae)["data"][0] == job["result"]
    refused(server, "grade_dictionary", 400, "sae_not_attached", sae_id=trained,
            corpus={"texts": texts[:3]})  # fmt: skip

    # a transcoder set trained and graded through the tools
    sets = {**body, "name": "mcp-set", "kind": "transcoder_set", "layer": None}
    started = call(server, "train_dictionary", **sets)
    while (view := call(server, "get_training", training_id=started["id"]))["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    found = view["result"]["transcoder_set_id"]
    job = call(server, "grade_transcoder_set", set_id=found, corpus={"texts": texts[:3]})
    while (job := call(server, "get_job", job_id=job["id"]))["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    card = call(server, "transcoder_set_grades", set_id=found)["data"][0]
    assert card == job["result"] and card["transcoder_set_id"] == found
    assert [entry["block"] for entry in card["figures"]["blocks"]] == [0, 1, 2]
    refused(server, "grade_transcoder_set", 404, "transcoder_set_not_found", set_id="tc_nope",
            corpus={"texts": texts[:3]})  # fmt: skip
    rest(server, "DELETE", f"/api/transcoders/{found}")
