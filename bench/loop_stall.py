"""The server's worst event-loop stall under load: streaming chats plus a steering writer.

What is measured, and how:

- A real `millm serve` on the demo model (continuous batching, MAX_BATCH_SIZE = --streams),
  started from --root, so the same script measures any checkout (a second worktree of an
  older commit, say). Before the load it is given --profiles saved profiles and --clusters
  imported clusters, and one cluster is made the steering base: tables of a realistic size
  that steering reads on every request.
- Load, for --seconds: --streams clients each loop streaming /v1/chat/completions requests of
  --tokens greedy tokens (every other one with its own `profile`, so both the active base and a
  per-request profile are planned), while one writer cycles through the steering API with a
  short pause: set a live strength, set the active cluster's dial, create and delete a profile,
  import and delete a cluster (each step's latency is printed too).
- The stall: a separate probe process (its own interpreter, so the bench's own asyncio loop
  cannot delay it) sends GET /api/health every 10 ms over one keep-alive connection and times
  each round trip. /api/health is an async handler doing no work, so its latency is how long a
  request waits for the server's event loop (plus a constant HTTP round trip, shown by the idle
  figures taken first, with no load). Anything that blocks the loop (a synchronous database
  call, JSON parsing, torch work, a lock held by a writer) shows up as a probe that took that
  long; the maximum is the worst stall seen. On a small shared CPU the decode threads also
  compete with the loop for the cores and the GIL; that is part of what a client sees, and is
  why the idle row and several runs matter when reading the figures.
- The server runs with OMP_NUM_THREADS=--threads (1 by default): on a small machine shared
  with other processes, two OpenMP threads per process wait on each other whenever another
  process takes a core, and decode swung tenfold between runs here; with one thread it held
  steady, so the runs of two checkouts can be compared (0: the server's default).
- Why not asyncio's own slow-callback warnings: uvicorn runs its loop with debug off whatever
  PYTHONASYNCIODEBUG says, so they cannot be switched on from outside the server; and a probe
  also sees what they would miss (many short callbacks in a row, the loop thread waiting for
  the GIL or a core).

Decode rate is every completion token of the requests that finished, over the wall time from
the first request to the last one's end.

    .venv/bin/python bench/loop_stall.py [--root DIR] [--streams 8] [--tokens 32] [--seconds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
LAYER, WIDTH, D_MODEL = 12, 2048, 576  # the demo SAE
PROBE_EVERY = 0.010


# the probe (its own process) ----------------------------------------------------------------------
def probe(base_url: str, stop, results) -> None:
    """GET /api/health every 10 ms until `stop` is set; sends [(monotonic start, ms), ...] back."""
    samples = []
    with httpx.Client(base_url=base_url, timeout=60) as client:
        while not stop.is_set():
            start = time.monotonic()
            client.get("/api/health").raise_for_status()
            samples.append((start, (time.monotonic() - start) * 1000))
            time.sleep(PROBE_EVERY)
    results.put(samples)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summary(values: list[float]) -> str:
    """n, p50, p99 and max of millisecond values."""
    if not values:
        return "n=0"
    return (
        f"n={len(values):5d}  p50 {percentile(values, 0.5):7.1f}  p99 "
        f"{percentile(values, 0.99):7.1f}  max {max(values):7.1f} ms"
    )


# documents ----------------------------------------------------------------------------------------
def profile_doc(name: str, sae_id: str, index: int) -> dict:
    """A one-feature profile on the demo SAE."""
    features = [
        {"index": index % WIDTH, "strength": 4.0},
        {"index": (index * 7 + 1) % WIDTH, "strength": -2.0},
    ]
    return {
        "kind": "millm.profile",
        "version": 1,
        "name": name,
        "steering": [{"sae_id": sae_id, "layer": LAYER, "features": features}],
    }


def cluster_doc(name: str, index: int) -> dict:
    """A three-member miStudio cluster on the demo SAE's layer and width."""
    members = [
        {"feature_idx": (index * 13 + k) % WIDTH, "strength": 3.0, "sign": 1, "label": f"f{k}"}
        for k in range(3)
    ]
    return {
        "kind": "mistudio.cluster-definition",
        "schema_version": "1",
        "name": name,
        "sae": {
            "mistudio_sae_id": "bench",
            "layer": LAYER,
            "hook_type": "resid_post",
            "n_features": WIDTH,
            "d_model": D_MODEL,
        },
        "members": members,
        "budget": {"B": 1.0, "intensity": 1.0},
    }


def populate(client: httpx.Client, profiles: int, clusters: int) -> tuple[str, str]:
    """Import the profiles and clusters, activate the first cluster; returns (SAE id, cluster
    id)."""
    (sae_id,) = [s["id"] for s in client.get("/api/saes").json()["data"] if s["attached"]]
    for start in range(0, profiles, 500):
        docs = [
            profile_doc(f"bench-{i}", sae_id, i) for i in range(start, min(profiles, start + 500))
        ]
        bundle = {"kind": "millm.profile-bundle", "version": 1, "profiles": docs}
        client.post("/api/profiles/import", json=bundle).raise_for_status()
    cluster_ids = []
    for start in range(0, clusters, 50):
        definitions = [
            cluster_doc(f"bench-cluster-{i}", i) for i in range(start, min(clusters, start + 50))
        ]
        bundle = {
            "kind": "mistudio.cluster-bundle",
            "schema_version": "1",
            "definitions": definitions,
        }
        response = client.post("/api/clusters/import", content=json.dumps(bundle))
        response.raise_for_status()
        cluster_ids += [row["id"] for row in response.json()["data"]]
    client.post(f"/api/clusters/{cluster_ids[0]}/activate").raise_for_status()
    return sae_id, cluster_ids[0]


# the load -----------------------------------------------------------------------------------------
async def one_chat(client: httpx.AsyncClient, tokens: int, profile: str | None) -> int:
    """One streamed chat completion; its completion tokens."""
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "Write the numbers from 1 to 200, separated by commas."}
        ],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if profile is not None:
        body["profile"] = profile
    used = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
    return used


async def streamer(
    client: httpx.AsyncClient, number: int, tokens: int, profiles: int, deadline: float, done: list
) -> None:
    """Requests back to back until the deadline; every other streamer sends its own profile."""
    turn = 0
    while time.monotonic() < deadline:
        profile = f"bench-{(number + turn) % profiles}" if number % 2 and profiles else None
        done.append(await one_chat(client, tokens, profile))
        turn += 1


async def writer(
    client: httpx.AsyncClient,
    sae_id: str,
    cluster_id: str,
    pause: float,
    deadline: float,
    latencies: dict,
) -> None:
    """Steering changes through the API, one after another, until the deadline; latencies by
    step."""
    turn = 0
    while time.monotonic() < deadline:
        name = f"writer-{turn}"
        steps = [
            (
                "strength",
                "PUT",
                f"/api/steering/saes/{sae_id}/features/{turn % WIDTH}",
                {"json": {"strength": 1.0 + turn % 5}},
            ),
            (
                "dial",
                "PUT",
                f"/api/clusters/{cluster_id}/intensity",
                {"json": {"intensity": 0.5 + (turn % 2) * 0.5}},
            ),
            (
                "profile+",
                "POST",
                "/api/profiles",
                {"json": {"name": name, "steering": profile_doc(name, sae_id, turn)["steering"]}},
            ),
            ("profile-", "DELETE", f"/api/profiles/{name}", {}),
            (
                "cluster+",
                "POST",
                "/api/clusters/import",
                {"content": json.dumps(cluster_doc(f"writer-cluster-{turn}", turn))},
            ),
        ]
        for step, method, path, kwargs in steps:
            start = time.monotonic()
            response = await client.request(method, path, **kwargs)
            response.raise_for_status()
            latencies.setdefault(step, []).append((time.monotonic() - start) * 1000)
            if step == "cluster+":
                imported = response.json()["data"][0]["id"]
                start = time.monotonic()
                (await client.delete(f"/api/clusters/{imported}")).raise_for_status()
                latencies.setdefault("cluster-", []).append((time.monotonic() - start) * 1000)
            await asyncio.sleep(pause)
        turn += 1


async def load(base_url: str, args, sae_id: str, cluster_id: str) -> dict:
    """Streams and the writer for args.seconds; tokens, wall time and write latencies."""
    limits = httpx.Limits(max_connections=args.streams + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        start = time.monotonic()
        deadline = start + args.seconds
        done: list[int] = []
        writes: dict[str, list[float]] = {}
        tasks = [
            streamer(client, n, args.tokens, args.profiles, deadline, done)
            for n in range(args.streams)
        ]
        if not args.no_writer:
            tasks.append(writer(client, sae_id, cluster_id, args.write_pause, deadline, writes))
        await asyncio.gather(*tasks)
        return {
            "tokens": sum(done),
            "requests": len(done),
            "wall": time.monotonic() - start,
            "writes": writes,
        }


# the run ------------------------------------------------------------------------------------------
def serve(root: Path, home: Path, streams: int, threads: int) -> ServerProcess:
    """`millm serve` of the checkout at `root` (python -m millm imports the current directory's)."""
    os.chdir(root)
    env = {
        "ENABLE_CONTINUOUS_BATCHING": "1",
        "MAX_BATCH_SIZE": str(streams),
        "PYTHONPATH": str(root),
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return ServerProcess(home, ["--log-level", "warning"], env=env).wait_ready(timeout=600)


def commit_of(root: Path) -> str:
    """The checkout's commit (with + when its tree has changes)."""
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    return head + ("+" if dirty.strip() else "")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the checkout to serve (default: this one)"
    )
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=40.0, help="load duration")
    parser.add_argument(
        "--idle", type=float, default=5.0, help="probe-only seconds before the load"
    )
    parser.add_argument("--profiles", type=int, default=300)
    parser.add_argument("--clusters", type=int, default=150)
    parser.add_argument(
        "--write-pause", type=float, default=0.02, help="seconds between the writer's steps"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="the server's OMP_NUM_THREADS (0: the default)"
    )
    parser.add_argument("--no-writer", action="store_true")
    args = parser.parse_args()
    root = args.root.resolve()
    load_before = os.getloadavg()[0]
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))

    server = serve(root, home, args.streams, args.threads)
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    prober = None
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            sae_id, cluster_id = populate(client, args.profiles, args.clusters)
        asyncio.run(
            load(
                server.base_url,
                argparse.Namespace(**{**vars(args), "seconds": 3}),
                sae_id,
                cluster_id,
            )
        )  # warm-up
        prober = context.Process(target=probe, args=(server.base_url, stop, results))
        prober.start()
        time.sleep(args.idle)
        loaded_from = time.monotonic()
        outcome = asyncio.run(load(server.base_url, args, sae_id, cluster_id))
        loaded_to = time.monotonic()
        stop.set()
        samples = results.get(timeout=60)
        prober.join(timeout=10)
    finally:
        if prober is not None and prober.is_alive():
            prober.terminate()
        server.stop()

    idle = [ms for t, ms in samples if t < loaded_from]
    loaded = [ms for t, ms in samples if loaded_from <= t < loaded_to]
    threads = f"OMP_NUM_THREADS={args.threads}" if args.threads else "default threads"
    print(f"\nserved: {root} @ {commit_of(root)}; {MODEL} (demo), continuous batching, {threads}")
    print(
        f"load: {args.streams} streams x {args.tokens} tokens, {args.seconds:g} s, "
        f"{args.profiles} profiles, {args.clusters} clusters (one active), writer "
        f"{'off' if args.no_writer else f'pause {args.write_pause * 1000:g} ms'}"
    )
    print(f"probe idle   {summary(idle)}")
    print(f"probe loaded {summary(loaded)}")
    print(
        f"decode       {outcome['tokens'] / outcome['wall']:.1f} tok/s ({outcome['tokens']} "
        f"tokens, {outcome['requests']} requests, {outcome['wall']:.1f} s)"
    )
    print(f"writes       {summary([ms for step in outcome['writes'].values() for ms in step])}")
    if outcome["writes"]:
        print(
            "  by step    "
            + ", ".join(
                f"{step} {percentile(ms, 0.5):.0f}/{max(ms):.0f}"
                for step, ms in outcome["writes"].items()
            )
            + " ms (p50/max)"
        )
    print(
        f"machine      {os.cpu_count()} CPUs, load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (other processes count)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
