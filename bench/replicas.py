"""Propagation delay between millm replicas sharing one PostgreSQL database. One run, one report of
two markdown tables.

The script starts a throwaway PostgreSQL cluster (tests/support/postgres.py: Debian's binaries,
initdb in a temporary folder) and --replicas real `millm serve` processes on it
(DATABASE_URL=postgresql+psycopg://...), each serving the tiny random-weight Llama of the tests (3
layers, d_model 64, built into a temporary folder in a second) or --model PATH (`--model demo`: the
demo model, millm started without --model). It registers one SAE through replica A (a tiny SAELens
SAE, 128 features at layer 1; the demo SAE with the demo; --sae PATH otherwise) and attaches it
there; the other replicas attach it through the change notice, and the script waits until each
reports it attached. 3 changes are made and waited for (warm-up: connections opened). Each of
the two parts then starts from no live values (cleared through A, and waited for on every replica):

  1. Sequential: --changes steering changes through A, one at a time, each a PUT
     /api/steering/saes/{id}/features/{random index} with a random strength (±0.01-50, two
     decimals). For each change, timed on the client:
     - write on A: time.perf_counter() from sending the PUT to A's response (how long a change
       takes to be live on the replica that made it; the response carries its version);
     - visible on B (each other replica): from A's response to the response of the first GET
       /api/steering on B whose `version` is >= the change's, polling B back to back with one
       keep-alive client (no sleep), and how many GETs that took; with more than two replicas
       each other replica is polled by its own thread at once;
     - applied on B, server side: B's `replica.last_change_at` in /api/health/inference (wall
       clock, time.time(), when B's listener finished reloading after A's notice) minus the
       client's time.time() just before the PUT was sent (read once the change is visible and
       B's `changes_applied` has counted it): an upper bound on the propagation that includes
       A's write. Client and servers share one machine, hence one clock. The table also gives
       it minus the write on A: when B applied the change, counted from A's response
       (negative: B had it before A's answer reached the client).
     Before the changes, 50 GETs /api/steering in a row on each other replica with nothing
     changing give the floor of "visible" (one GET's round trip).
     Then: each replica's `changes_applied` during the run (A: 0, its own changes are not
     notices to it; every other: --changes), and whether any change was lost (each replica's
     final feature values must equal A's, and A's must equal the last strength the client set
     per feature).
  2. Concurrent: A and B each make --changes/2 changes at once from two threads (A even feature
     indices, B odd ones, so the final value of every feature is known), each timed as above
     against the other writer. Every change must land: the final version must be the initial one
     + --changes (one version per change), every replica must reach it with the same values,
     and those must be each thread's last strength per feature. Here B may see A's change
     through its own next write (which reads the state back on commit) before A's notice arrives.

Figures are p50 / p90 / p99 / max in milliseconds (statistics.quantiles, inclusive). The
processes and PostgreSQL are stopped at the end, also on failure.

    .venv/bin/python bench/replicas.py [--changes 200] [--replicas 2] [--model PATH|demo]
        [--sae PATH] [--seed 0] [--quick]

--quick makes 20 changes (to check the script end to end, not to read figures).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.postgres import PostgresServer, binaries  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402
from tests.support.waiting import until  # noqa: E402

VISIBLE_TIMEOUT_S = 10.0  # a change not visible on a replica within this is counted as lost
NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass
class Timing:
    """One change as one other replica saw it."""

    write_ms: float
    visible_ms: float | None  # None: not visible within VISIBLE_TIMEOUT_S
    polls: int
    applied_ms: float | None  # None: the replica's changes_applied never counted it

    @property
    def after_response_ms(self) -> float | None:
        """When the replica applied the change, from A's response (negative: before A answered)."""
        return None if self.applied_ms is None else self.applied_ms - self.write_ms


@dataclass
class Replica:
    name: str
    server: ServerProcess
    client: httpx.Client = field(init=False)  # the writer's (and setup's) client
    poller: httpx.Client = field(init=False)  # the client that polls it for others' changes

    def __post_init__(self):
        self.client = httpx.Client(base_url=self.server.base_url, timeout=60)
        self.poller = httpx.Client(base_url=self.server.base_url, timeout=60)

    def get(self, path: str, client: httpx.Client | None = None) -> dict:
        response = (client or self.client).get(path)
        response.raise_for_status()
        return response.json()

    def health(self) -> dict:
        return self.get("/api/health/inference", self.poller)["replica"]

    def close(self) -> None:
        self.client.close()
        self.poller.close()


# the cluster --------------------------------------------------------------------------------------
def build_tiny(work: Path, seed: int) -> tuple[Path, Path]:
    """The tests' tiny Llama (its tokenizer trained here) and a SAELens SAE at layer 1 for it."""
    from tests.support import tiny_models
    from tests.support.tiny_saes import build_saelens

    tokenizer = work / "tokenizer"
    with contextlib.suppress(ImportError):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    tiny_models.build_tokenizer(tokenizer)
    model = tiny_models.build_llama(work / "tiny-llama", tokenizer, seed=seed)
    sae = build_saelens(work / "sae", layer=1, seed=seed + 31)
    return model, sae


def start_replicas(
    count: int, work: Path, model: Path | None, sae: Path, url: str
) -> list[Replica]:
    """`count` servers on one database, started together, each waited for; stopped again if any
    fails."""
    args = ["--model", str(model)] if model is not None else []
    allowed = [work, sae] + ([model] if model is not None else [])
    servers = []
    try:
        for n in range(count):
            servers.append(
                ServerProcess(
                    work / f"home-{NAMES[n].lower()}",
                    args,
                    env={"DATABASE_URL": url},
                    allowed=allowed,
                )
            )
        for server in servers:
            server.wait_ready(timeout=600)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return [Replica(NAMES[n], server) for n, server in enumerate(servers)]


def attach_everywhere(replicas: list[Replica], sae: Path) -> tuple[str, int]:
    """Register + attach through A; wait until every replica reports it attached. (id, d_sae)"""
    a = replicas[0]
    registered = a.client.post("/api/saes", json={"path": str(sae)})
    if registered.status_code not in (200, 201):
        raise RuntimeError(f"registering {sae} on A: {registered.status_code} {registered.text}")
    info = registered.json()
    sae_id = info["id"]
    attached = a.client.post(f"/api/saes/{sae_id}/attach")
    if attached.status_code != 200 and not is_attached(
        a, sae_id
    ):  # the demo's own SAE is attached already
        raise RuntimeError(f"attaching {sae_id} on A: {attached.status_code} {attached.text}")
    for replica in replicas:
        until(
            lambda r=replica: is_attached(r, sae_id),
            timeout=60,
            what=f"{sae_id} attached on {replica.name}",
        )
    return sae_id, int(info["d_sae"])


def is_attached(replica: Replica, sae_id: str) -> bool:
    views = {s["id"]: s for s in replica.get("/api/saes")["data"]}
    return bool(views.get(sae_id, {}).get("attached"))


# measuring ----------------------------------------------------------------------------------------
def put(replica: Replica, sae_id: str, index: int, strength: float) -> tuple[float, float, int]:
    """(wall clock before sending, write ms, the change's version)."""
    wall = time.time()
    start = time.perf_counter()
    response = replica.client.put(
        f"/api/steering/saes/{sae_id}/features/{index}", json={"strength": strength}
    )
    write_ms = (time.perf_counter() - start) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"PUT on {replica.name}: {response.status_code} {response.text}")
    body = response.json()
    return wall, write_ms, int(body["steering"]["version"])


def watch(
    replica: Replica, version: int, since: float, wall: float, write_ms: float, applied_target: int
) -> Timing:
    """Poll `replica` (its own client, no sleep) until its version reaches `version`, then read
    when its listener applied the change (`changes_applied` >= `applied_target`)."""
    polls, visible_ms = 0, None
    deadline = since + VISIBLE_TIMEOUT_S
    while True:
        state = replica.get("/api/steering", replica.poller)
        polls += 1
        now = time.perf_counter()
        if state["version"] >= version:
            visible_ms = (now - since) * 1000
            break
        if now > deadline:
            break
    applied_ms = None
    while True:
        health = replica.health()
        if health["changes_applied"] >= applied_target and health["last_change_at"] is not None:
            applied_ms = (health["last_change_at"] - wall) * 1000
            break
        if time.perf_counter() > deadline:
            break
    return Timing(write_ms, visible_ms, polls, applied_ms)


def features_of(replica: Replica, sae_id: str) -> dict[int, float]:
    state = replica.get("/api/steering")
    mine = next((s for s in state["saes"] if s["sae_id"] == sae_id), {"features": []})
    return {f["index"]: f["strength"] for f in mine["features"]}


def settle(replicas: list[Replica], clear: str | None = None) -> int:
    """Clear the live values of SAE `clear` through A (when given), wait until every replica has
    A's version and its listener has counted the notice; that version."""
    if clear is not None:
        replicas[0].client.delete(
            "/api/steering/features", params={"sae_id": clear}
        ).raise_for_status()
    version = replicas[0].get("/api/steering")["version"]
    for replica in replicas:
        until(
            lambda r=replica: r.get("/api/steering")["version"] >= version,
            timeout=60,
            what=f"version {version} on {replica.name}",
        )
    time.sleep(0.3)  # a listener counts a notice just after its reload makes the version visible
    return version


def sequential(replicas: list[Replica], sae_id: str, d_sae: int, changes: int, rng: random.Random):
    a, others = replicas[0], replicas[1:]
    settle(replicas, clear=sae_id)
    applied0 = {r.name: r.health()["changes_applied"] for r in replicas}
    expected: dict[int, float] = {}
    timings: dict[str, list[Timing]] = {r.name: [] for r in others}
    idle = {r.name: idle_get_ms(r) for r in others}
    with ThreadPoolExecutor(max_workers=max(1, len(others) - 1)) as pool:
        for k in range(1, changes + 1):
            index, strength = rng.randrange(d_sae), strength_for(rng)
            expected[index] = strength
            wall, write_ms, version = put(a, sae_id, index, strength)
            since = time.perf_counter()
            jobs = [
                pool.submit(watch, r, version, since, wall, write_ms, applied0[r.name] + k)
                for r in others[1:]
            ]
            timings[others[0].name].append(
                watch(others[0], version, since, wall, write_ms, applied0[others[0].name] + k)
            )
            for replica, job in zip(others[1:], jobs, strict=True):
                timings[replica.name].append(job.result())
    settle(replicas)
    applied = {r.name: r.health()["changes_applied"] - applied0[r.name] for r in replicas}
    finals = {r.name: features_of(r, sae_id) for r in replicas}
    return timings, applied, finals, expected, idle


def idle_get_ms(replica: Replica, count: int = 50) -> list[float]:
    """How long one GET /api/steering takes with nothing changing: the floor of "visible"."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        replica.get("/api/steering", replica.poller)
        times.append((time.perf_counter() - start) * 1000)
    return times


def concurrent(replicas: list[Replica], sae_id: str, d_sae: int, changes: int, seed: int):
    """A and B write changes//2 each at once (A even indices, B odd); each timed against the
    other."""
    a, b = replicas[0], replicas[1]
    initial = settle(replicas, clear=sae_id)
    applied0 = {r.name: r.health()["changes_applied"] for r in replicas}
    half = changes // 2
    results: dict[str, list[Timing]] = {}
    expected: dict[int, float] = {}
    failures: list[str] = []
    start = threading.Barrier(2)

    def writer(me: Replica, other: Replica, parity: int, rng: random.Random):
        mine: list[Timing] = []
        try:
            start.wait()
            for k in range(1, half + 1):
                index = 2 * rng.randrange((d_sae - parity + 1) // 2) + parity
                strength = strength_for(rng)
                expected[index] = strength
                wall, write_ms, version = put(me, sae_id, index, strength)
                since = time.perf_counter()
                # `other` applies only `me`'s notices (its own are not notices to it), in commit
                # order.
                mine.append(watch(other, version, since, wall, write_ms, applied0[other.name] + k))
        except Exception as exc:  # reported, not raised: the other thread must finish
            failures.append(f"{me.name}: {exc}")
        results[f"{me.name} → {other.name}"] = mine

    threads = [
        threading.Thread(target=writer, args=(a, b, 0, random.Random(seed * 2 + 1))),
        threading.Thread(target=writer, args=(b, a, 1, random.Random(seed * 2 + 2))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    target = initial + 2 * half
    reached = {}
    for replica in replicas:
        with contextlib.suppress(RuntimeError):
            until(
                lambda r=replica: r.get("/api/steering")["version"] >= target,
                timeout=10,
                what=f"version {target} on {replica.name}",
            )
        reached[replica.name] = replica.get("/api/steering")["version"]
    applied = {r.name: r.health()["changes_applied"] - applied0[r.name] for r in replicas}
    finals = {r.name: features_of(r, sae_id) for r in replicas}
    return results, failures, initial, reached, applied, finals, expected


def strength_for(rng: random.Random) -> float:
    return round(rng.uniform(0.01, 50.0), 2) * rng.choice((-1, 1))


# the report ---------------------------------------------------------------------------------------
def quantiles(values: list[float]) -> tuple[float, float, float, float]:
    """p50, p90, p99, max."""
    if not values:
        return (float("nan"),) * 4
    if len(values) == 1:
        return (values[0],) * 4
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[89], cuts[98], max(values)


def column(timings: list[Timing], attribute: str) -> list[float]:
    return [v for t in timings if (v := getattr(t, attribute)) is not None]


def lost(
    finals: dict[str, dict[int, float]], expected: dict[int, float], reference: str
) -> list[str]:
    """What differs: each replica's final values against the reference replica's, and those
    against the client's."""
    problems = []
    want = finals[reference]
    for name, values in finals.items():
        if values != want:
            diff = sorted(i for i in set(values) | set(want) if values.get(i) != want.get(i))
            problems.append(
                f"{name} differs from {reference} at {len(diff)} feature(s) ({diff[:8]})"
            )
    wrong = sorted(
        i
        for i in set(want) | set(expected)
        if want.get(i) is None or expected.get(i) is None or abs(want[i] - expected[i]) > 1e-4
    )
    if wrong:
        problems.append(
            f"{reference} differs from the last strengths the client set at {len(wrong)} "
            f"feature(s) ({wrong[:8]})"
        )
    return problems


def fmt(value: float) -> str:
    return f"{value:.2f}" if value == value else "–"


def print_sequential(
    timings, applied, finals, expected, idle, changes: int, names: list[str]
) -> bool:
    others = names[1:]
    header = ["ms", "write on A"]
    for name in others:
        header += [
            f"visible on {name}",
            f"applied on {name} (server clock, from before the PUT)",
            f"applied on {name}, from A's response",
            f"GETs on {name} until visible (count)",
        ]
    print(f"### 1. {changes} changes through A, one at a time\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    writes = quantiles(column(timings[others[0]], "write_ms"))
    per = {
        n: [
            quantiles(column(timings[n], a))
            for a in ("visible_ms", "applied_ms", "after_response_ms")
        ]
        + [quantiles([float(t.polls) for t in timings[n]])]
        for n in others
    }
    for row, label in enumerate(("p50", "p90", "p99", "max")):
        cells = [label, fmt(writes[row])]
        for name in others:
            visible, applied_ms, after, polls = per[name]
            cells += [fmt(visible[row]), fmt(applied_ms[row]), fmt(after[row]), f"{polls[row]:.0f}"]
        print("| " + " | ".join(cells) + " |")
    missing = {n: sum(t.visible_ms is None for t in timings[n]) for n in others}
    print()
    floors = ", ".join(
        f"{n} p50 {fmt(quantiles(idle[n])[0])} / max {fmt(quantiles(idle[n])[3])}" for n in others
    )
    print(
        f"one GET /api/steering with nothing changing ({len(idle[others[0]])} in a row, before "
        f'the changes; the floor of "visible"), ms: {floors}'
    )
    counters = ", ".join(f"{n} {applied[n]}" for n in names)
    ok_counts = applied[names[0]] == 0 and all(applied[n] == changes for n in others)
    print(
        f"changes_applied during the run: {counters} (expected: A 0, every other {changes}) "
        f"{'✓' if ok_counts else '✗'}"
    )
    problems = lost(finals, expected, names[0])
    if any(missing.values()):
        late = ", ".join(f"{n} {c}" for n, c in missing.items())
        problems.insert(0, f"not visible within {VISIBLE_TIMEOUT_S:g} s: {late}")
    verdict = (
        f"none: every replica ends with A's values ({len(expected)} features), which are "
        "the last strengths set"
    )
    print(f"lost changes: {'; '.join(problems) if problems else verdict}")
    return ok_counts and not problems


def print_concurrent(
    results, failures, initial, reached, applied, finals, expected, changes: int, names: list[str]
) -> bool:
    half = changes // 2
    print(f"\n### 2. {2 * half} changes at once: A and B {half} each, from two threads\n")
    print(
        "| direction | changes timed | write p50 / p90 / p99 / max | visible on the other p50 / "
        "p90 / p99 / max | applied on the other p50 / p90 / p99 / max | GETs until visible p50 / "
        "max |"
    )
    print("|---|---|---|---|---|---|")
    for direction, timings in results.items():
        cells = [direction, str(len(timings))]
        for attribute in ("write_ms", "visible_ms", "applied_ms"):
            cells.append(" / ".join(fmt(v) for v in quantiles(column(timings, attribute))))
        polls = quantiles([float(t.polls) for t in timings])
        cells.append(f"{polls[0]:.0f} / {polls[3]:.0f}")
        print("| " + " | ".join(cells) + " |")
    target = initial + 2 * half
    print()
    ok_versions = all(v == target for v in reached.values())
    print(
        f"final version: initial {initial} + {2 * half} changes = {target}; replicas: "
        + ", ".join(f"{n} {v}" for n, v in reached.items())
        + f" {'✓' if ok_versions else '✗'}"
    )
    want = {n: (half if n in names[:2] else 2 * half) for n in names}
    ok_counts = applied == want
    print(
        "changes_applied during the run: "
        + ", ".join(f"{n} {applied[n]}" for n in names)
        + f" (expected: A and B {half} each, the other's; any other {2 * half}) "
        f"{'✓' if ok_counts else '✗'}"
    )
    problems = failures + lost(finals, expected, names[0])
    verdict = (
        "none: every replica ends with the same values, each thread's last strength per feature"
    )
    print(f"lost changes: {'; '.join(problems) if problems else verdict}")
    return ok_versions and ok_counts and not problems


def machine(args, pg_bin: Path) -> str:
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    versions = []
    for name in ("millm", "torch", "transformers", "sqlalchemy", "psycopg", "uvicorn", "httpx"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    postgres = "PostgreSQL ?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        postgres = subprocess.run(
            [str(pg_bin / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    model = (
        "the demo model (SmolLM2-135M-Instruct)"
        if args.model == "demo"
        else (args.model or "the tests' tiny Llama (3 layers, d_model 64)")
    )
    return (
        f"{args.replicas} replicas serving {model}, one PostgreSQL on this machine; {cpu}, "
        f"{os.cpu_count()} cores; {postgres}; {', '.join(versions)}; Python "
        f"{platform.python_version()}; load average {load:.2f} at start"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--changes",
        type=int,
        default=None,
        help="steering changes per part (default 200; 20 with --quick)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=2,
        help="millm processes on the database (default 2; at least 2)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="a checkpoint folder, or 'demo' (default: the tests' tiny Llama, built here)",
    )
    parser.add_argument(
        "--sae",
        default=None,
        help="the SAE to steer through (default: a tiny one for the tiny model, the demo SAE for "
        "the demo)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="features and strengths (and the tiny model's weights)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="20 changes: checks the script end to end"
    )
    args = parser.parse_args()
    if args.changes is None:
        args.changes = 20 if args.quick else 200
    if args.replicas < 2 or args.replicas > len(NAMES) or args.changes < 2:
        parser.error("--replicas must be 2-26 and --changes at least 2")
    pg_bin = binaries()
    if pg_bin is None:
        parser.error("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb)")

    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="millm-bench-replicas-"))
    postgres, replicas = None, []
    try:
        if args.model is None:
            model, sae = build_tiny(work, args.seed)
        elif args.model == "demo":
            from millm.kernel.model.shipped import DEMO_SAE

            model, sae = None, Path(args.sae) if args.sae else DEMO_SAE
        else:
            if not args.sae:
                parser.error("--model PATH needs --sae PATH (an SAE for that model)")
            model, sae = Path(args.model).resolve(), Path(args.sae)
        sae = sae.resolve()
        print(
            "## Replicas: propagation of steering "
            f"changes{' (--quick: too few changes to read figures from)' if args.quick else ''}\n"
        )
        print(machine(args, pg_bin))
        postgres = PostgresServer()
        replicas = start_replicas(args.replicas, work, model, sae, postgres.url)
        names = [r.name for r in replicas]
        sae_id, d_sae = attach_everywhere(replicas, sae)
        rng = random.Random(args.seed)
        sequential(replicas, sae_id, d_sae, 3, rng)  # warm-up: connections, first reloads
        print(
            f"\nSAE {sae_id} ({d_sae} features) attached on every replica; replica ids "
            + ", ".join(f"{r.name} {r.health()['replica_id']}" for r in replicas)
            + "\n"
        )

        ok = print_sequential(
            *sequential(replicas, sae_id, d_sae, args.changes, rng), args.changes, names
        )
        ok = (
            print_concurrent(
                *concurrent(replicas, sae_id, d_sae, args.changes, args.seed), args.changes, names
            )
            and ok
        )
        losses = {r.name: r.health()["connection_losses"] for r in replicas}
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"\nconnection losses: {', '.join(f'{n} {v}' for n, v in losses.items())}; load "
            f"average {load:.2f} at the end; {time.perf_counter() - began:.0f} s in all"
        )
        return 0 if ok else 1
    except BaseException:
        for replica in replicas:
            tail = replica.server.log.splitlines()[-20:]
            print(
                f"\n--- replica {replica.name}'s log, last lines ---\n" + "\n".join(tail),
                file=sys.stderr,
            )
        raise
    finally:
        for replica in replicas:
            replica.close()
            replica.server.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
