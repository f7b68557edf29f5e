"""/api/monitoring on a live server (tiny Llama, one TopK SAE attached): settings and their
refusals, per-request records equal to the request's own pre_steering read, statistics derived
from the records, a bounded history, the live SSE feed, scoring and embeddings never recorded,
and settings that survive a restart."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.api.clients import MODEL, api, post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about rivers."}],
    "max_tokens": 6,
    "temperature": 0,
}


def wait_records(server, count, timeout=30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = api(server, "GET", "/api/monitoring/records", params={"limit": 1000}).json()[
            "data"
        ]
        if len(records) >= count:
            return records
        time.sleep(0.05)
    raise AssertionError(f"expected {count} records, have {len(records)}")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("monitor-home")


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    return build_saelens(
        tmp_path_factory.mktemp("monitor-sae") / "sae", layer=1, architecture="topk", seed=77
    )


@pytest.fixture(scope="module")
def server(tiny_dirs, home, sae_dir):
    process = ServerProcess(
        home, ["--model", str(tiny_dirs["llama"])], env={"MONITORING_HISTORY": "4"}
    )
    try:
        process.wait_ready()
        refused = api(process, "POST", "/api/monitoring/enable")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "sae_not_attached"
        process.sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{process.sae}/attach", {}).status_code == 200
        assert (
            api(
                process, "PUT", f"/api/steering/saes/{process.sae}/features/2", json={"strength": 5}
            ).status_code
            == 200
        )
        yield process
    finally:
        process.stop()


@pytest.fixture
def fresh(server):
    api(
        server,
        "PUT",
        "/api/monitoring",
        json={"enabled": False, "features": None, "top_k": 5, "positions": "completion"},
    )
    api(server, "POST", "/api/monitoring/reset")
    return server


def test_settings_are_validated_whole(fresh):
    before = api(fresh, "GET", "/api/monitoring").json()
    for body, needle in [
        ({"top_k": 65}, "top_k"),
        ({"positions": "middle"}, "positions"),
        ({"features": [128], "sae_id": fresh.sae}, "past the width"),
        ({"sae_id": "sae_000000000000"}, "sae_000000000000"),
        ({"colour": "blue"}, "colour"),
    ]:
        response = api(fresh, "PUT", "/api/monitoring", json=body)
        assert response.status_code in (400, 404, 422), response.text
        assert needle in response.text
    assert api(fresh, "GET", "/api/monitoring").json() == before


def test_records_equal_the_requests_own_pre_steering_read(fresh):
    settings = api(
        fresh,
        "PUT",
        "/api/monitoring",
        json={"enabled": True, "features": [2, 5, 9, 40], "top_k": 3},
    ).json()
    assert (
        settings["reading"] == {"sae_id": fresh.sae, "layer": 1}
        and settings["read_point"] == "pre_steering"
    )
    ask = {
        "sae_id": fresh.sae,
        "features": [2, 5, 9, 40],
        "top_k": 3,
        "positions": "completion",
        "read_point": "pre_steering",
    }
    answer = post(fresh, "/v1/chat/completions", {**CHAT, "return_sae_activations": ask}).json()
    [record] = wait_records(fresh, 1)
    assert (
        record["sae_id"] == fresh.sae
        and record["layer"] == 1
        and record["read_point"] == "pre_steering"
    )
    assert record["positions"] == answer["millm"]["sae_activations"]["positions"]
    assert all(
        len(p["features"]) == 3 and {f["index"] for f in p["features"]} <= {2, 5, 9, 40}
        for p in record["positions"]
    )
    listed = api(fresh, "GET", "/api/monitoring/stats").json()["features"]
    assert [f["index"] for f in listed] == [2, 5, 9, 40]  # every watched feature, fired or not
    assert all(
        f["count"] == 0 and f["mean"] == 0.0
        for f in listed
        if f["index"]
        not in {e["index"] for p in record["positions"] for e in p["features"] if e["value"] > 0}
    )


def test_statistics_follow_the_records_and_reset_clears_them(fresh):
    api(
        fresh,
        "PUT",
        "/api/monitoring",
        json={"enabled": True, "features": None, "top_k": 4, "positions": "all"},
    )
    for topic in ("rivers", "cities"):
        post(
            fresh,
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": f"About {topic}."}]},
        )
    records = wait_records(fresh, 2)
    values: dict[int, list[float]] = {}
    positions = 0
    for record in records:
        positions += len(record["positions"])
        for entry in record["positions"]:
            for feature in entry["features"]:
                values.setdefault(feature["index"], []).append(feature["value"])
    stats = api(fresh, "GET", "/api/monitoring/stats").json()
    assert stats["positions_read"] == positions and stats["requests"] == 2
    by_index = {f["index"]: f for f in stats["features"]}
    assert set(by_index) == set(values)
    for index, seen in values.items():
        assert by_index[index]["count"] == len(seen)
        assert by_index[index]["mean"] == pytest.approx(sum(seen) / len(seen))
        assert by_index[index]["max"] == pytest.approx(max(seen))
        assert by_index[index]["fraction_active"] == pytest.approx(len(seen) / positions)
    cleared = api(fresh, "POST", "/api/monitoring/reset").json()
    assert cleared["positions_read"] == 0 and cleared["features"] == []
    assert api(fresh, "GET", "/api/monitoring/records").json()["data"] == []


def test_scoring_and_embeddings_are_never_recorded_and_disabled_records_nothing(fresh):
    api(fresh, "POST", "/api/monitoring/enable")
    for path, body in [
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "The river", "max_tokens": 1, "logprobs": 2},
        ),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 1, "logprobs": True}),
        ("/v1/embeddings", {"model": MODEL, "input": "The river"}),
    ]:
        assert (
            post(fresh, path, body).status_code == 200
        )  # each really ran, so its absence below means something
    # Prompts of growing length tell the three generations' records apart by their first position.
    generate = {"model": MODEL, "max_tokens": 3, "temperature": 0}
    first = post(fresh, "/v1/completions", {**generate, "prompt": "The river"}).json()["usage"]
    api(fresh, "POST", "/api/monitoring/disable")
    unmonitored = post(
        fresh, "/v1/completions", {**generate, "prompt": "The river and the sea"}
    ).json()["usage"]
    api(fresh, "POST", "/api/monitoring/enable")
    last = post(
        fresh, "/v1/completions", {**generate, "prompt": "The river, the sea and the old hills"}
    ).json()["usage"]
    assert first["prompt_tokens"] < unmonitored["prompt_tokens"] < last["prompt_tokens"]
    assert (
        min(u["completion_tokens"] for u in (first, unmonitored, last)) >= 2
    )  # each record has a position

    # The worker records in the order rows finished, so once the last generation's record is in,
    # anything handed over before it (scoring, embeddings, the disabled request) would be too.
    deadline = time.monotonic() + 30
    while True:
        records = wait_records(fresh, 1)
        if any(r["positions"][0]["position"] == last["prompt_tokens"] for r in records):
            break
        assert time.monotonic() < deadline, records
        time.sleep(0.05)
    assert [[p["position"] for p in r["positions"]] for r in records] == [
        # completion positions; the final sampled token is never fed back, so it has none
        list(range(u["prompt_tokens"], u["prompt_tokens"] + u["completion_tokens"] - 1))
        for u in (first, last)
    ]
    assert api(fresh, "GET", "/api/monitoring/stats").json()["requests"] == 2


def test_history_is_bounded(fresh):
    api(fresh, "POST", "/api/monitoring/enable")
    for i in range(6):
        post(fresh, "/v1/completions", {"model": MODEL, "prompt": f"Count {i}", "max_tokens": 2})
    deadline = time.monotonic() + 30
    while (
        api(fresh, "GET", "/api/monitoring/stats").json()["requests"] < 6
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    records = api(fresh, "GET", "/api/monitoring/records", params={"limit": 100}).json()["data"]
    assert len(records) == 4  # MONITORING_HISTORY
    ids = [r["id"] for r in records]
    assert ids == sorted(ids)
    assert (
        api(fresh, "GET", "/api/monitoring/records", params={"after": ids[1]}).json()["data"]
        == records[2:]
    )


def test_live_feed_pushes_each_record(fresh):
    api(fresh, "POST", "/api/monitoring/enable")
    received, ready = [], threading.Event()

    def listen():
        with httpx.stream("GET", f"{fresh.base_url}/api/monitoring/stream", timeout=60) as response:
            for line in response.iter_lines():
                ready.set()
                if line.startswith("data: "):
                    received.append(json.loads(line[6:]))
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(30)
    post(fresh, "/v1/completions", {"model": MODEL, "prompt": "Live", "max_tokens": 3})
    listener.join(30)
    [record] = wait_records(fresh, 1)
    assert received == [record]


def test_settings_survive_a_restart(tiny_dirs, home, server):
    api(
        server,
        "PUT",
        "/api/monitoring",
        json={"enabled": True, "features": [2, 9], "top_k": 2, "positions": "last"},
    )
    server.stop()
    again = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    try:
        again.wait_ready()
        settings = api(again, "GET", "/api/monitoring").json()
        assert (
            settings["enabled"],
            settings["features"],
            settings["top_k"],
            settings["positions"],
        ) == (True, [2, 9], 2, "last")
        post(again, "/v1/completions", {"model": MODEL, "prompt": "Again", "max_tokens": 3})
        [record] = wait_records(again, 1)
        assert len(record["positions"]) == 1
    finally:
        again.stop()
