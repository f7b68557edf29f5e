"""Replicas on one PostgreSQL database: real servers (a tiny Llama), a real PostgreSQL started here.

A change made through any replica steers every replica; concurrent writers lose nothing; a
replica killed mid-write or cut off from the database catches up before it claims anything;
an SAE another replica cannot load is reported, never silently skipped; two servers on one
SQLite file are refused; replicas drain one batch together, and a replica killed mid-chunk
leaves its lines to the others, each line answered once.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from sqlalchemy import create_engine, text

from millm.store.database import database_url
from millm.store.single_process import claim_sqlite
from tests.api.clients import MODEL, api, error, sdk
from tests.support.postgres import binaries
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tcp_proxy import TcpProxy
from tests.support.tiny_saes import build_saelens
from tests.support.waiting import until

pytestmark = pytest.mark.skipif(binaries() is None, reason="PostgreSQL binaries are not installed")

USER = [{"role": "user", "content": "Tell me about the city."}]


@pytest.fixture(scope="module")
def proxy(postgres):
    relay = TcpProxy(postgres.port)
    yield relay
    relay.close()


@pytest.fixture(scope="module")
def saes(tmp_path_factory):
    base = tmp_path_factory.mktemp("replica-saes")
    # `private` lies outside the folder replica C may read (see cluster): C cannot attach it.
    return {
        "shared": build_saelens(base / "shared" / "a", layer=1, seed=31),
        "private": build_saelens(tmp_path_factory.mktemp("a-only") / "b", layer=2, seed=32),
    }


def start_replica(home, tiny_dirs, url: str, allowed: list | None = None) -> ServerProcess:
    """A replica on `url`; a batch line it claimed is anyone's 3 s after it stopped saying so."""
    env = {"DATABASE_URL": url, "MILLM_BATCH_CLAIM_SECONDS": "3"}
    return ServerProcess(home, ["--model", str(tiny_dirs["llama"])], env=env, allowed=allowed)


@pytest.fixture(scope="module")
def cluster(tiny_dirs, postgres, proxy, saes, tmp_path_factory):
    """A, B and C on one database; B reaches it through a relay a test can cut; C may read only
    the shared SAE's folder."""
    url = postgres.url
    through_proxy = url.replace(f":{postgres.port}/", f":{proxy.port}/")
    homes = {name: tmp_path_factory.mktemp(f"replica-{name}") for name in "abc"}
    replicas = {
        "a": start_replica(homes["a"], tiny_dirs, url),
        "b": start_replica(homes["b"], tiny_dirs, through_proxy),
        "c": start_replica(homes["c"], tiny_dirs, url, [saes["shared"].parent, tiny_dirs["llama"]]),
    }
    try:
        for replica in replicas.values():
            replica.wait_ready()
        a = replicas["a"]
        ids = {}
        for key in ("shared", "private"):
            ids[key] = api(a, "POST", "/api/saes", json={"path": str(saes[key])}).json()["id"]
            assert api(a, "POST", f"/api/saes/{ids[key]}/attach").status_code == 200
        yield replicas, ids, homes
    finally:
        for replica in replicas.values():
            replica.stop()


def steering(server) -> dict:
    return api(server, "GET", "/api/steering").json()


def greedy(server) -> tuple[str, str]:
    response = api(
        server,
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 12, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], response.headers["x-millm-steering"]


def at_version(server, version: int):
    return lambda: (state := steering(server))["version"] >= version and state


@pytest.fixture
def fresh(cluster):
    """Every test starts from no live values, steering on, no active base, every replica in step."""
    replicas, ids, _ = cluster
    a = replicas["a"]
    api(a, "DELETE", "/api/steering/features")
    api(a, "POST", "/api/steering/enable")
    api(a, "POST", "/api/profiles/deactivate")
    version = steering(a)["version"]
    for replica in replicas.values():
        until(at_version(replica, version))
    return cluster


def test_an_sae_attached_on_a_is_attached_on_b_and_c_where_they_may_read_it(fresh):
    replicas, ids, _ = fresh
    for name in "ab":
        views = {s["id"]: s for s in api(replicas[name], "GET", "/api/saes").json()["data"]}
        assert views[ids["shared"]]["attached"] and views[ids["private"]]["attached"], name
    c = {s["id"]: s for s in api(replicas["c"], "GET", "/api/saes").json()["data"]}
    assert c[ids["shared"]]["attached"] is True
    assert c[ids["private"]]["attached"] is False
    assert "outside the directories this server reads" in c[ids["private"]]["attach_error"]


def test_a_strength_set_on_a_steers_b_and_c_as_on_a(fresh):
    replicas, ids, _ = fresh
    unsteered = {name: greedy(replica)[0] for name, replica in replicas.items()}
    assert len(set(unsteered.values())) == 1
    changed = api(
        replicas["a"],
        "PUT",
        f"/api/steering/saes/{ids['shared']}/features/5",
        json={"strength": 40},
    ).json()
    assert changed["live"] is True
    version = changed["steering"]["version"]
    answers = {}
    for name, replica in replicas.items():
        state = until(at_version(replica, version))
        mine = next(s for s in state["saes"] if s["sae_id"] == ids["shared"])
        assert (
            mine["features"] == [{"index": 5, "op": "add", "strength": 40.0}]
            and state["live"] is True
        ), name
        answers[name] = greedy(replica)
    assert answers["a"][0] != unsteered["a"]  # the strength changes the answer
    assert answers["b"] == answers["c"] == answers["a"]
    assert member(answers["a"][1])[1]["version"] == version


def test_a_value_on_an_sae_c_cannot_load_is_reported_on_c_not_skipped(fresh):
    replicas, ids, _ = fresh
    unsteered = greedy(replicas["c"])[0]
    version = api(
        replicas["a"],
        "PUT",
        f"/api/steering/saes/{ids['private']}/features/2",
        json={"strength": 30},
    ).json()["steering"]["version"]
    c = replicas["c"]
    state = until(at_version(c, version))
    private = next(s for s in state["saes"] if s["sae_id"] == ids["private"])
    assert private["attached"] is False and "outside the directories" in private["attach_error"]
    assert steering(replicas["b"])["live"] is True
    answer, header = greedy(c)
    assert (
        header
        == f'none;reason="live values\' SAEs not attached here";unattached="{ids["private"]}"'
    )
    assert answer == unsteered  # C does not steer with it, and says so
    steered, header = greedy(replicas["b"])
    assert member(header)[1]["version"] == version and steered != unsteered


def test_a_profile_created_on_b_is_activated_on_c_and_steers_a(fresh):
    replicas, ids, _ = fresh
    document = {
        "name": "made-on-b",
        "steering": [
            {"sae_id": ids["shared"], "layer": 1, "features": [{"index": 9, "strength": 35}]}
        ],
    }
    created = api(replicas["b"], "POST", "/api/profiles", json=document)
    assert created.status_code == 201, created.text
    # at once: no wait for the notice
    activated = api(replicas["c"], "POST", "/api/profiles/made-on-b/activate")
    assert activated.status_code == 200, activated.text
    version = activated.json()["steering"]["version"]
    for name, replica in replicas.items():
        state = until(at_version(replica, version))
        assert state["active_profile"]["name"] == "made-on-b", name
        kind, params = member(greedy(replica)[1])
        assert (kind, params["name"], params["version"]) == ("profile", "made-on-b", version), name
    api(replicas["a"], "DELETE", "/api/profiles/made-on-b")


def test_two_replicas_writing_different_features_at_once_lose_nothing(fresh):
    replicas, ids, _ = fresh
    sae = ids["shared"]
    failures = []

    def write(replica, indices):
        for index in indices:
            response = api(
                replica,
                "PUT",
                f"/api/steering/saes/{sae}/features/{index}",
                json={"strength": index + 1},
            )
            if response.status_code != 200:
                failures.append(response.text)

    threads = [
        threading.Thread(target=write, args=(replicas[name], range(start, 64, 3)))
        for start, name in enumerate("abc")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    expected = [{"index": i, "op": "add", "strength": float(i + 1)} for i in range(64)]
    final = steering(replicas["a"])
    assert next(s for s in final["saes"] if s["sae_id"] == sae)["features"] == expected
    assert final["version"] >= 64
    for replica in replicas.values():
        state = until(at_version(replica, final["version"]))
        assert next(s for s in state["saes"] if s["sae_id"] == sae)["features"] == expected


def test_one_profile_changed_on_two_replicas_conflicts_by_revision_and_never_merges_halves(fresh):
    replicas, ids, _ = fresh
    a, b = replicas["a"], replicas["b"]
    entry = {"sae_id": ids["shared"], "layer": 1, "features": [{"index": 1, "strength": 2}]}
    created = api(
        a,
        "POST",
        "/api/profiles",
        json={"name": "contested", "description": "v1", "steering": [entry]},
    ).json()
    assert created["revision"] == 1
    won = api(a, "PUT", "/api/profiles/contested", json={"description": "from a", "revision": 1})
    assert won.status_code == 200 and won.json()["revision"] == 2
    late = error(
        api(b, "PUT", "/api/profiles/contested", json={"description": "from b", "revision": 1}),
        409,
        "revision_conflict",
    )
    assert "revision 2, not 1" in late["message"]
    # Without a revision, each update lands on the stored profile: fields one writer did not send
    # are the other's.
    api(
        b,
        "PUT",
        "/api/profiles/contested",
        json={"steering": [{**entry, "features": [{"index": 3, "strength": 4}]}]},
    )
    stored = until(
        lambda: (row := api(a, "GET", "/api/profiles/contested").json())["revision"] == 3 and row
    )
    assert stored["document"]["description"] == "from a"
    assert stored["document"]["steering"][0]["features"] == [
        {"index": 3, "op": "add", "strength": 4.0}
    ]
    api(a, "DELETE", "/api/profiles/contested")


def shared_values(server) -> tuple[int, dict]:
    """The version and every SAE's live values, as one replica reports them."""
    state = steering(server)
    return state["version"], {s["sae_id"]: s["features"] for s in state["saes"] if s["features"]}


def restart_c(cluster, tiny_dirs, postgres, saes) -> ServerProcess:
    """Start replica C again (after a test killed it)."""
    replicas, _, homes = cluster
    allowed = [saes["shared"].parent, tiny_dirs["llama"]]
    replicas["c"] = start_replica(homes["c"], tiny_dirs, postgres.url, allowed)
    return replicas["c"].wait_ready()


def test_a_replica_killed_mid_write_catches_up_on_restart(fresh, tiny_dirs, postgres, saes):
    replicas, ids, homes = fresh
    sae = ids["shared"]
    c = replicas["c"]
    stop = threading.Event()

    def hammer():
        index = 0
        while not stop.is_set():
            try:
                httpx.put(
                    f"{c.base_url}/api/steering/saes/{sae}/features/{index % 50}",
                    json={"strength": 7},
                    timeout=5,
                )
            except httpx.HTTPError:
                return
            index += 1

    writer = threading.Thread(target=hammer)
    writer.start()
    time.sleep(0.5)
    # SIGKILL mid-write: a transaction in flight is rolled back by PostgreSQL, never half kept
    c.process.kill()
    c.process.wait()
    stop.set()
    writer.join()
    a = replicas["a"]
    api(
        a,
        "POST",
        "/api/steering/features",
        json={"features": [{"sae_id": sae, "index": 60, "strength": -9}]},
    )
    api(a, "POST", "/api/profiles", json={"name": "while-c-was-down", "steering": []})
    restarted = restart_c(fresh, tiny_dirs, postgres, saes)
    assert shared_values(restarted) == shared_values(a)
    assert "while-c-was-down" in [
        p["name"] for p in api(restarted, "GET", "/api/profiles").json()["data"]
    ]
    for feature in next(s for s in steering(a)["saes"] if s["sae_id"] == sae)["features"]:
        assert feature["strength"] in (7.0, -9.0)  # each write whole or not at all
    api(a, "DELETE", "/api/profiles/while-c-was-down")


def test_a_replica_cut_off_from_the_database_claims_nothing_then_catches_up(fresh, proxy):
    replicas, ids, _ = fresh
    a, b = replicas["a"], replicas["b"]
    proxy.cut()
    try:
        until(lambda: httpx.get(f"{b.base_url}/api/health/ready").status_code == 503)
        ready = httpx.get(f"{b.base_url}/api/health/ready").json()
        assert (
            ready["status"] == "out_of_step"
            and "out of step with the shared database" in ready["error"]
        )
        state = steering(b)
        assert state["live"] is False and "out of step" in state["live_reason"]
        _, header = greedy(b)  # it still answers, with the state it last read, and says so
        assert member(header)[1]["unsynced"] is True
        refused = error(
            api(b, "PUT", f"/api/steering/saes/{ids['shared']}/features/4", json={"strength": 3}),
            503,
            "store_unavailable",
        )
        assert "nothing was changed" in refused["message"]
        changed = api(
            a, "PUT", f"/api/steering/saes/{ids['shared']}/features/8", json={"strength": 25}
        ).json()["steering"]
        inference = api(b, "GET", "/api/health/inference").json()["replica"]
        assert inference["in_step"] is False and inference["shared"] is True
    finally:
        proxy.restore()
    until(lambda: httpx.get(f"{b.base_url}/api/health/ready").status_code == 200, timeout=15)
    state = steering(b)
    assert state["version"] >= changed["version"] and state["live"] is True
    assert next(s for s in state["saes"] if s["sae_id"] == ids["shared"])["features"] == [
        {"index": 8, "op": "add", "strength": 25.0}
    ]
    assert member(greedy(b)[1])[1]["version"] == state["version"]
    assert api(b, "GET", "/api/health/inference").json()["replica"]["reloads"] >= 2


def test_two_servers_on_one_sqlite_file_are_refused(tiny_dirs, tmp_path):
    first = ServerProcess(tmp_path / "home", ["--model", str(tiny_dirs["llama"])]).wait_ready()
    try:
        second = ServerProcess(tmp_path / "home", ["--model", str(tiny_dirs["llama"])])
        assert second.process.wait(timeout=60) == 2
        log = second.log
        assert f"another millm server (pid {first.process.pid}) is using the SQLite database" in log
        assert "DATABASE_URL" in log
        assert httpx.get(f"{first.base_url}/api/health/ready").status_code == 200
    finally:
        first.stop()
    claim_sqlite(
        database_url(tmp_path / "home", None)
    ).release()  # the lock went with the first process


def test_notices_name_their_topic_and_origin():
    from millm.store.changes import Topic, parse_notice

    assert parse_notice("steering abc123") == (Topic.STEERING, "abc123")
    assert parse_notice("from-a-newer-replica abc") is None


def test_documents_labels_and_monitoring_set_on_one_replica_are_read_on_the_others(fresh):
    from tests.support.mistudio_docs import cluster, raw

    replicas, ids, _ = fresh
    a, b, c = replicas["a"], replicas["b"], replicas["c"]
    sae = ids["shared"]
    imported = api(
        a,
        "POST",
        "/api/clusters/import",
        content=raw(cluster(name="shared-cluster", n_features=128)),
        headers={"content-type": "application/json"},
    )
    assert imported.status_code == 201, imported.text
    assert (
        api(
            b, "PUT", "/api/clusters/shared-cluster/intensity", json={"intensity": 0.75}
        ).status_code
        == 200
    )
    until(lambda: api(c, "GET", "/api/clusters/shared-cluster").json().get("intensity") == 0.75)
    # C now holds the set in memory
    assert api(c, "GET", f"/api/saes/{sae}/features", params={"q": "zanzibar"}).json()["data"] == []
    labels = api(
        b,
        "PUT",
        f"/api/saes/{sae}/labels",
        content=b'{"4": "zanzibar spice routes"}',
        headers={"content-type": "application/json"},
    )
    assert labels.status_code == 200, labels.text
    found = until(
        lambda: api(c, "GET", f"/api/saes/{sae}/features", params={"q": "zanzibar"}).json()["data"]
    )
    assert [(f["index"], f["label"]) for f in found] == [(4, "zanzibar spice routes")]
    assert (
        api(c, "PUT", "/api/monitoring", json={"sae_id": sae, "features": [4, 5]}).status_code
        == 200
    )
    until(lambda: api(a, "GET", "/api/monitoring").json()["features"] == [4, 5])
    for replica in (a, b, c):
        assert until(
            lambda r=replica: api(r, "GET", "/api/health/inference").json()["replica"]["in_step"]
        )
    api(a, "DELETE", "/api/clusters/shared-cluster")
    api(a, "DELETE", f"/api/saes/{sae}/labels")
    api(a, "PUT", "/api/monitoring", json={"features": []})


def test_a_variant_made_on_b_is_a_model_on_a_and_c_until_a_deletes_it(fresh):
    replicas, ids, _ = fresh
    a, b, c = replicas["a"], replicas["b"], replicas["c"]
    steering = [{"sae_id": ids["shared"], "layer": 1, "features": [{"index": 9, "strength": 35}]}]
    made = api(
        b,
        "POST",
        "/api/variants",
        json={"name": "shared-variant", "base": MODEL, "steering": {"steering": steering}},
    )
    assert made.status_code == 201, made.text

    def listed(server) -> bool:
        return "shared-variant" in [
            m["id"] for m in api(server, "GET", "/v1/models").json()["data"]
        ]

    until(lambda: listed(a) and listed(c))
    body = {"messages": USER, "max_tokens": 12, "temperature": 0}
    on_c = api(c, "POST", "/v1/chat/completions", json={"model": "shared-variant", **body})
    own = api(
        a,
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "steering": {"steering": steering}, **body},
    )
    assert on_c.status_code == 200, on_c.text
    assert on_c.json()["choices"][0]["message"] == own.json()["choices"][0]["message"]
    assert api(a, "DELETE", "/api/variants/shared-variant").status_code == 200
    until(lambda: not listed(c) and not listed(b))
    error(api(c, "POST", "/v1/chat/completions", json={"model": "shared-variant", **body}), 404)


def test_a_replica_serving_another_model_does_not_attach_it(fresh, tiny_dirs, postgres, tmp_path):
    replicas, ids, _ = fresh
    other = ServerProcess(
        tmp_path / "home-d",
        ["--model", str(tiny_dirs["llama-plain"])],
        env={"DATABASE_URL": postgres.url},
    ).wait_ready()
    try:
        views = {s["id"]: s for s in api(other, "GET", "/api/saes").json()["data"]}
        served = httpx.get(f"{other.base_url}/api/health/ready").json()["model"]
        assert served != MODEL
        for key in ("shared", "private"):
            assert views[ids[key]]["attached"] is False
            assert (
                views[ids[key]]["attach_error"]
                == f"attached on model {MODEL!r}; this replica serves {served!r}"
            )
        state = steering(other)
        assert state["live"] is False and state["live_reason"] == "no SAE is attached"
    finally:
        other.stop()


def test_a_replica_whose_database_goes_silent_finds_out_and_catches_up(fresh, proxy):
    replicas, ids, _ = fresh
    a, b = replicas["a"], replicas["b"]
    proxy.freeze()  # B's connections stay open but nothing comes back: no reset tells it anything
    try:
        until(
            lambda: httpx.get(f"{b.base_url}/api/health/ready", timeout=30).status_code == 503,
            timeout=15,
        )
        assert (
            "no answer" in httpx.get(f"{b.base_url}/api/health/ready", timeout=30).json()["error"]
        )
        started = time.monotonic()
        error(
            api(b, "PUT", f"/api/steering/saes/{ids['shared']}/features/6", json={"strength": 1}),
            503,
            "store_unavailable",
        )
        assert time.monotonic() - started < 10  # refused, not left waiting on a dead connection
        changed = api(
            a, "PUT", f"/api/steering/saes/{ids['shared']}/features/6", json={"strength": 11}
        ).json()["steering"]
    finally:
        proxy.restore()
    until(
        lambda: httpx.get(f"{b.base_url}/api/health/ready", timeout=30).status_code == 200,
        timeout=20,
    )
    assert shared_values(b) == shared_values(a) and shared_values(b)[0] >= changed["version"]


def test_what_one_replica_registers_is_found_on_another_at_once(fresh, tmp_path, tiny_dirs):
    replicas, _, _ = fresh
    a, b = replicas["a"], replicas["b"]
    sae = api(
        a,
        "POST",
        "/api/saes",
        json={"path": str(build_saelens(tmp_path / "new-sae", layer=0, seed=77))},
    ).json()["id"]
    # no wait for the notice: a miss reads the store once more
    found = api(b, "GET", f"/api/saes/{sae}")
    assert found.status_code == 200 and found.json()["layer"] == 0
    registered = api(
        a, "POST", "/api/models", json={"source": str(tiny_dirs["gemma2"]), "name": "second-model"}
    )
    assert registered.status_code in (200, 201), registered.text
    assert api(b, "GET", "/api/models/second-model").status_code == 200
    assert api(b, "DELETE", f"/api/saes/{sae}").status_code == 200
    assert api(a, "DELETE", "/api/models/second-model").status_code == 200
    # forgotten through B, gone on A too
    until(lambda: api(a, "GET", f"/api/saes/{sae}").status_code == 404)


def run_batch(server, lines: int, max_tokens: int) -> str:
    """A completions batch of `lines` lines made through `server`; its id."""
    client = sdk(server)
    entries = [
        {
            "custom_id": f"row-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": f"Row {i} says", "max_tokens": max_tokens},
        }
        for i in range(lines)
    ]
    data = "".join(json.dumps(entry) + "\n" for entry in entries).encode()
    stored = client.files.create(file=("rows.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=stored.id, endpoint="/v1/completions", completion_window="24h"
    ).id


def finished(server, batch_id: str) -> tuple[object, list[dict]]:
    """The batch once it ended, and its output lines."""
    client = sdk(server)
    batch = until(lambda: (b := client.batches.retrieve(batch_id)).status == "completed" and b, 120)
    assert batch.error_file_id is None
    text = client.files.content(batch.output_file_id).content.decode()
    return batch, [json.loads(line) for line in text.splitlines()]


def replica_id(server) -> str:
    return api(server, "GET", "/api/health/inference").json()["replica"]["replica_id"]


def test_replicas_drain_one_batch_together_and_answer_each_line_once(fresh):
    replicas, _, _ = fresh
    batch_id = run_batch(replicas["a"], 120, 4)
    batch, output = finished(replicas["b"], batch_id)
    assert [line["custom_id"] for line in output] == [f"row-{i}" for i in range(120)]
    assert batch.request_counts.completed == 120 and batch.request_counts.failed == 0
    ran_on = {line["response"]["millm"]["replica_id"] for line in output}
    assert ran_on <= {replica_id(r) for r in replicas.values()} and len(ran_on) >= 2


def test_a_replica_killed_mid_chunk_leaves_its_lines_to_the_others(
    fresh, tiny_dirs, postgres, saes
):
    replicas, _, _ = fresh
    c = replicas["c"]
    victim = replica_id(c)
    batch_id = run_batch(replicas["a"], 240, 8)
    engine = create_engine(postgres.url)
    held_by_c = text("SELECT line FROM millm_batch_pending WHERE batch_id = :b AND runner = :r")
    try:
        with engine.connect() as conn:

            def held() -> list[int]:
                return list(conn.execute(held_by_c, {"b": batch_id, "r": victim}).scalars())

            until(held, 60, interval=0.01, what="C claims a chunk")
            c.process.kill()  # mid-chunk: the lines it holds are neither recorded nor let go
            c.process.wait()
            lost = held()  # what C held as it died (its claims lapse 3 s later)
    finally:
        engine.dispose()
    assert lost
    batch, output = finished(replicas["a"], batch_id)
    assert [line["custom_id"] for line in output] == [f"row-{i}" for i in range(240)]
    assert batch.request_counts.completed == 240
    survivors = {replica_id(replicas["a"]), replica_id(replicas["b"])}
    for line in lost:  # once its claim lapsed, another replica ran each line C held
        assert output[line - 1]["response"]["millm"]["replica_id"] in survivors
    restart_c(fresh, tiny_dirs, postgres, saes)
