"""Crash durability: `kill -9` the server while it writes profiles and clusters under load, restart
it on the same data directory, and check that everything acknowledged is there and nothing is
half-written.

Several writer threads create profiles (single POSTs and bundle imports), import clusters (single
definitions and bundles) and turn cluster dials, each under a unique name, while chat completions
keep the model busy. Every request is entered in a ledger before it is sent and marked acknowledged
when a 2xx answer comes back. After a seeded delay the server is killed with SIGKILL; requests in
flight then fail, and are "maybe" writes: they may or may not be stored, but never in part. A fresh
server on the same home must then show every acknowledged write exactly as sent, bundles
all-or-nothing, no row that was never sent, readable exports, a clean `PRAGMA integrity_check`, and
answer a chat completion. The cycle runs several times on the one database, each check covering all
earlier cycles too.

MILLM_CRASH_SEED overrides the seed (to explore other interleavings when running it repeatedly) and
MILLM_CRASH_CYCLES the number of kill/restart cycles (2 by default, to stay near a minute).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from dataclasses import dataclass, field

import httpx

from tests.api.clients import MODEL
from tests.support.mistudio_docs import cluster, raw
from tests.support.server import ServerProcess

SEED = int(os.environ.get("MILLM_CRASH_SEED", "20240611"))
# each restart costs ~8-15 s on a 2-core machine
CYCLES = int(os.environ.get("MILLM_CRASH_CYCLES", "2"))
WRITERS = 4
CHATTERS = 2
KILL_AFTER = (1.5, 3.0)  # seconds after the writers start, drawn per cycle
# wait (a little) longer than the drawn delay until at least this many writes are acknowledged
MIN_ACKED = 20
MAX_EXTRA_WAIT = 15.0
INTENSITY_MAX = 2.0  # the server's default STEERING_INTENSITY_MAX

USER = [{"role": "user", "content": "Tell me about the river."}]


@dataclass
class Write:
    """One write request: what was sent, and whether the server acknowledged it (a 2xx answer)."""

    cycle: int
    writer: int
    kind: str  # profile | profile_bundle | cluster | cluster_bundle | intensity
    names: list[str]  # the profile or cluster names it creates, or the cluster whose dial it sets
    sent: object  # profile documents, cluster definitions / raw bytes, or the intensity value
    acked: bool = False
    status: int | None = None  # the HTTP status, when an answer came back
    failure: str | None = None  # the transport error, when none did
    failed_at: float | None = None
    answer: dict = field(default_factory=dict)  # name -> id (and intensity) from the answer

    def label(self) -> str:
        state = "acked" if self.acked else f"unacked ({self.failure or self.status})"
        return f"cycle {self.cycle} writer {self.writer} {self.kind} {self.names} [{state}]"


class Ledger:
    """Every write of every cycle, in the order each writer sent them."""

    def __init__(self):
        self.writes: list[Write] = []
        self.lock = threading.Lock()

    def add(self, write: Write) -> Write:
        with self.lock:
            self.writes.append(write)
        return write

    def acked(self, cycle: int | None = None) -> list[Write]:
        return [w for w in self.writes if w.acked and (cycle is None or w.cycle == cycle)]


def profile_entries(rng: random.Random) -> list[dict]:
    """Canonical steering entries (floats, distinct SAEs and indices), so the stored document
    equals them."""
    entries = []
    for sae in rng.sample(range(1000), rng.randint(1, 3)):
        entry = {"sae_id": f"sae_{sae:012x}"}
        if rng.random() < 0.7:
            entry["layer"] = rng.randint(0, 30)
        entry["features"] = [
            {"index": i, "strength": round(rng.uniform(-200, 200), 3)}
            for i in rng.sample(range(128), rng.randint(1, 5))
        ]
        entries.append(entry)
    return entries


def cluster_doc(name: str, rng: random.Random) -> dict:
    members = [
        {
            "feature_idx": i,
            "strength": round(rng.uniform(0, 150), 2),
            "sign": rng.choice([1, -1]),
            "label": f"m{i}",
        }
        for i in rng.sample(range(128), rng.randint(1, 6))
    ]
    return cluster(
        name=name,
        layer=rng.randint(0, 2),
        members=members,
        intensity=round(rng.uniform(0, INTENSITY_MAX), 3),
        extra={"x_crash_note": name, "narrative": "n" * rng.randint(0, 300)},
    )


class Writer(threading.Thread):
    """Creates profiles and clusters and turns its own clusters' dials until stopped or the
    server is gone."""

    def __init__(self, server, ledger: Ledger, cycle: int, index: int, stop: threading.Event):
        super().__init__(name=f"writer-{cycle}-{index}", daemon=True)
        self.server, self.ledger, self.cycle, self.index, self.stop = (
            server,
            ledger,
            cycle,
            index,
            stop,
        )
        self.rng = random.Random(SEED * 1000 + cycle * 10 + index)
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"c{self.cycle}-w{self.index}-{self.count}"

    def own_clusters(self) -> list[tuple[str, str]]:
        """(name, id) of acknowledged clusters created by this writer's index, in any cycle."""
        return [
            (name, cid)
            for w in self.ledger.acked()
            if w.writer == self.index and w.kind in ("cluster", "cluster_bundle")
            for name, cid in w.answer.items()
            if not name.startswith("@")
        ]

    def next_write(self) -> tuple[Write, str, str, dict]:
        """The next write and how to send it: method, path, request keyword arguments."""
        rng, choice = self.rng, self.rng.random()
        owned = self.own_clusters()
        if choice < 0.25:
            name = self.fresh()
            body = {
                "name": name,
                "description": f"desc {name} " + "d" * rng.randint(0, 500),
                "steering": profile_entries(rng),
            }
            return (
                Write(self.cycle, self.index, "profile", [name], [body]),
                "POST",
                "/api/profiles",
                {"json": body},
            )
        if choice < 0.45:
            docs = []
            for _ in range(rng.randint(2, 3)):
                name = self.fresh()
                docs.append(
                    {
                        "kind": "millm.profile",
                        "version": 1,
                        "name": name,
                        "description": f"bundled {name}",
                        "steering": profile_entries(rng),
                    }
                )
            bundle = {"kind": "millm.profile-bundle", "version": 1, "profiles": docs}
            write = Write(self.cycle, self.index, "profile_bundle", [d["name"] for d in docs], docs)
            return write, "POST", "/api/profiles/import", {"json": bundle}
        if choice < 0.65 or (choice >= 0.85 and not owned):
            name = self.fresh()
            doc = cluster_doc(name, rng)
            body = raw(doc)
            write = Write(self.cycle, self.index, "cluster", [name], [body])
            return (
                write,
                "POST",
                "/api/clusters/import",
                {
                    "content": body,
                    "params": {"on_conflict": "fail"},
                    "headers": {"content-type": "application/json"},
                },
            )
        if choice < 0.85:
            definitions = [cluster_doc(self.fresh(), rng) for _ in range(rng.randint(2, 3))]
            bundle = {
                "kind": "mistudio.cluster-bundle",
                "schema_version": "1",
                "definitions": definitions,
            }
            write = Write(
                self.cycle,
                self.index,
                "cluster_bundle",
                [d["name"] for d in definitions],
                definitions,
            )
            return (
                write,
                "POST",
                "/api/clusters/import",
                {"json": bundle, "params": {"on_conflict": "fail"}},
            )
        name, cid = rng.choice(owned)
        value = round(rng.uniform(0, INTENSITY_MAX), 3)
        write = Write(self.cycle, self.index, "intensity", [name], value)
        return write, "PUT", f"/api/clusters/{cid}/intensity", {"json": {"intensity": value}}

    def run(self) -> None:
        with httpx.Client(base_url=self.server.base_url, timeout=60) as client:
            while not self.stop.is_set():
                write, method, path, kwargs = self.next_write()
                # entered before it is sent: a write in flight at the kill is a "maybe"
                self.ledger.add(write)
                try:
                    response = client.request(method, path, **kwargs)
                except httpx.HTTPError as exc:
                    write.failure, write.failed_at = (
                        f"{type(exc).__name__}: {exc}",
                        time.monotonic(),
                    )
                    return  # the server is gone (or the connection broke): this writer is done
                write.status = response.status_code
                if not response.is_success:
                    continue  # checked later: a refusal is not expected at all
                body = response.json()
                rows = body.get("data", [body])
                for row in rows:
                    write.answer[row["name"]] = row["id"]
                    if "intensity" in row:
                        write.answer["@intensity:" + row["name"]] = row["intensity"]
                write.acked = True


class Chatter(threading.Thread):
    """Keeps the model generating until stopped or the server is gone."""

    def __init__(self, server, stop: threading.Event, index: int):
        super().__init__(name=f"chatter-{index}", daemon=True)
        self.server, self.stop, self.index = server, stop, index
        self.done = 0
        self.refused: list[str] = []

    def run(self) -> None:
        body = {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 8 + 4 * self.index,
            "temperature": 0.7,
        }
        with httpx.Client(base_url=self.server.base_url, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    response = client.post("/v1/chat/completions", json=body)
                except httpx.HTTPError:
                    return
                if response.status_code == 200:
                    self.done += 1
                elif response.status_code != 503:  # 503 is backpressure: fine under load
                    self.refused.append(f"{response.status_code}: {response.text[:200]}")


def start(home, tiny_dirs) -> ServerProcess:
    server = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    try:
        return server.wait_ready()
    except BaseException:
        server.stop()  # a server that cannot (re)start on this home must not linger
        raise


def crash_cycle(server: ServerProcess, ledger: Ledger, cycle: int, delay: float) -> dict:
    """Write under load, kill -9 after `delay` seconds (or once MIN_ACKED writes are in), wait
    for the threads."""
    stop = threading.Event()
    writers = [Writer(server, ledger, cycle, i, stop) for i in range(WRITERS)]
    chatters = [Chatter(server, stop, i) for i in range(CHATTERS)]
    for thread in chatters + writers:
        thread.start()
    began = time.monotonic()
    time.sleep(delay)
    while (
        len(ledger.acked(cycle)) < MIN_ACKED and time.monotonic() - began < delay + MAX_EXTRA_WAIT
    ):
        time.sleep(0.05)
    killed_at = time.monotonic()
    server.process.kill()  # SIGKILL: no shutdown hooks, no flush, no rollback
    server.process.wait()
    stop.set()
    server.stop()  # only closes the log now
    for thread in writers + chatters:
        thread.join(90)
        assert not thread.is_alive(), f"{thread.name} still running 90 s after the kill"
    mine = [w for w in ledger.writes if w.cycle == cycle]
    early = [w.label() for w in mine if w.failed_at is not None and w.failed_at < killed_at]
    refused = [f"{w.label()} -> {w.status}" for w in mine if w.status is not None and not w.acked]
    assert not early, f"cycle {cycle}: connections failed before the kill:\n" + "\n".join(early)
    assert not refused, f"cycle {cycle}: writes refused under load:\n" + "\n".join(refused)
    assert not any(c.refused for c in chatters), [c.refused for c in chatters]
    return {
        "cycle": cycle,
        "kill_after_s": round(killed_at - began, 2),
        "acked": len([w for w in mine if w.acked]),
        "unacked": len([w for w in mine if not w.acked]),
        "chats": sum(c.done for c in chatters),
    }


def allowed_intensities(ledger: Ledger) -> dict[str, set[float]]:
    """Cluster name -> the dial values it may show: the last acknowledged one, or an
    unacknowledged later one."""
    allowed: dict[str, set[float]] = {}
    for write in ledger.writes:
        if write.kind in ("cluster", "cluster_bundle"):
            for name, definition in zip(write.names, write.sent, strict=True):
                doc = json.loads(definition) if isinstance(definition, bytes) else definition
                acknowledged = write.answer.get("@intensity:" + name)
                allowed[name] = (
                    {acknowledged}
                    if acknowledged is not None
                    else {min(doc["budget"]["intensity"], INTENSITY_MAX)}
                )
        elif write.kind == "intensity":
            (name,) = write.names
            if write.acked:
                allowed[name] = {float(write.sent)}
            else:
                allowed[name].add(float(write.sent))
    return allowed


def verify(server: ServerProcess, ledger: Ledger, home) -> dict:
    """Everything acknowledged is there as sent; bundles all-or-nothing; nothing half-written or
    never sent."""
    problems: list[str] = []
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        return _verify(client, ledger, home, problems)


def _verify(client: httpx.Client, ledger: Ledger, home, problems: list[str]) -> dict:
    listed = client.get("/api/profiles")
    assert listed.status_code == 200, (
        f"listing profiles after the restart: {listed.status_code} {listed.text[:500]}"
    )
    profiles = {row["name"]: row for row in listed.json()["data"]}
    listed = client.get("/api/clusters")
    assert listed.status_code == 200, (
        f"listing clusters after the restart: {listed.status_code} {listed.text[:500]}"
    )
    clusters = {row["name"]: row for row in listed.json()["data"]}
    exports: dict[str, bytes] = {}
    for name, row in clusters.items():
        exported = client.get(f"/api/clusters/{row['id']}/export")
        if exported.status_code != 200:
            problems.append(f"cluster {name}: export answered {exported.status_code}")
            continue
        try:
            json.loads(exported.content)
        except ValueError as exc:
            problems.append(
                f"cluster {name}: export is not JSON ({exc}): {exported.content[:200]!r}"
            )
        exports[name] = exported.content

    sent_profiles = {
        w_name for w in ledger.writes if w.kind.startswith("profile") for w_name in w.names
    }
    sent_clusters = {
        w_name for w in ledger.writes if w.kind.startswith("cluster") for w_name in w.names
    }
    problems += [
        f"profile {n}: stored but never sent" for n in sorted(set(profiles) - sent_profiles)
    ]
    problems += [
        f"cluster {n}: stored but never sent" for n in sorted(set(clusters) - sent_clusters)
    ]

    checked = {"acked_profiles": 0, "acked_clusters": 0, "dials": 0}
    for write in ledger.writes:
        if write.kind == "intensity":
            continue
        table = profiles if write.kind.startswith("profile") else clusters
        present = [name for name in write.names if name in table]
        if write.acked and len(present) != len(write.names):
            problems.append(
                f"LOST {write.label()}: missing {sorted(set(write.names) - set(present))}"
            )
        elif present and len(present) != len(write.names):
            problems.append(f"HALF-WRITTEN {write.label()}: only {present} of {write.names} stored")
        for name, sent in zip(write.names, write.sent, strict=True):
            if name not in table:
                continue
            if write.kind.startswith("profile"):
                row = profiles[name]
                # Sent as version 1: stored as its version 2 form, every feature an add (same
                # meaning).
                expected = {
                    "kind": "millm.profile",
                    "description": "",
                    **sent,
                    "version": 2,
                    "steering": [
                        {
                            **entry,
                            "features": [
                                {"index": f["index"], "op": "add", "strength": f["strength"]}
                                for f in entry["features"]
                            ],
                        }
                        for entry in sent["steering"]
                    ],
                }
                if row["document"] != expected:
                    problems.append(
                        f"profile {name} ({write.label()}): stored {row['document']!r} != sent "
                        f"{expected!r}"
                    )
                if write.acked and row["id"] != write.answer.get(name):
                    problems.append(
                        f"profile {name}: id {row['id']} != acknowledged {write.answer.get(name)}"
                    )
                checked["acked_profiles"] += write.acked
            else:
                row, exported = clusters[name], exports.get(name)
                if write.kind == "cluster" and exported != sent:
                    problems.append(
                        f"cluster {name} ({write.label()}): export is not byte-for-byte what was "
                        "sent"
                    )
                if (
                    write.kind == "cluster_bundle"
                    and exported is not None
                    and json.loads(exported) != sent
                ):
                    problems.append(
                        f"cluster {name} ({write.label()}): export {exported[:200]!r} != the "
                        "definition sent"
                    )
                if write.acked and row["id"] != write.answer.get(name):
                    problems.append(
                        f"cluster {name}: id {row['id']} != acknowledged {write.answer.get(name)}"
                    )
                checked["acked_clusters"] += write.acked
    for name, values in allowed_intensities(ledger).items():
        if name in clusters:
            if clusters[name]["intensity"] not in values:
                problems.append(
                    f"cluster {name}: intensity {clusters[name]['intensity']} not among the "
                    f"allowed {sorted(values)}"
                )
            checked["dials"] += 1

    with sqlite3.connect(f"file:{home / 'millm.db'}?mode=ro", uri=True) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchall()
    if integrity != [("ok",)]:
        problems.append(f"PRAGMA integrity_check: {integrity}")

    answer = client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": USER, "max_tokens": 8, "temperature": 0},
    )
    if answer.status_code != 200 or not answer.json()["choices"][0]["message"]["content"]:
        problems.append(
            f"chat completion after the restart: {answer.status_code} {answer.text[:300]}"
        )

    assert not problems, (
        f"{len(problems)} durability problem(s) after kill -9 and restart:\n"
        + "\n".join(problems[:40])
    )
    return {**checked, "profiles_stored": len(profiles), "clusters_stored": len(clusters)}


def test_kill_9_under_load_keeps_every_acknowledged_write(tiny_dirs, tmp_path):
    home = tmp_path / "crash-home"
    rng = random.Random(SEED)
    ledger = Ledger()
    server = start(home, tiny_dirs)
    report = []
    try:
        for cycle in range(CYCLES):
            began = time.monotonic()
            summary = crash_cycle(server, ledger, cycle, rng.uniform(*KILL_AFTER))
            restart = time.monotonic()
            server = start(home, tiny_dirs)
            checking = time.monotonic()
            summary.update(verify(server, ledger, home))
            summary["seconds"] = {
                "writes+kill": round(restart - began, 1),
                "restart": round(checking - restart, 1),
                "verify": round(time.monotonic() - checking, 1),
            }
            report.append(summary)
            assert summary["acked"] >= MIN_ACKED // 2, (
                f"too few writes acknowledged to mean much: {summary}"
            )
    finally:
        if server.process.poll() is None:
            server.stop()
        print(f"\ncrash durability (seed {SEED}):", *report, sep="\n  ")
