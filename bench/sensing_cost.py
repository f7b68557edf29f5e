"""What sensing costs a generation: decode tok/s with nothing armed, a cluster armed and a
circuit armed, at 1 and 8 concurrent streams, on a serial server and a continuously batching one,
in one run (goal: <= 5 % at 8 streams).

Each server runs the demo model with its SAE (layer 12, 2048 features, TopK k=32: a member's
activation needs the whole encode, the dearest case). A cluster of 4 demo features and a circuit
of 3 edges among 4 features at layer 12 are imported with strength 0, so they steer nothing and
every mode generates the same tokens: the only difference is sensing. The cluster is active in
"nothing armed" (sensing off) and "cluster armed"; the circuit in "circuit armed". Modes are
interleaved within each repeat so drift on a shared machine hits each alike; a figure is the
median over --repeats of the streams' total completion tokens over the wall time from the first
request to the last answer. Every request has a prompt of its own, so none is served from the
prefix cache (a sensed row never is: it reads every position).

    .venv/bin/python bench/sensing_cost.py [--tokens 96] [--repeats 3] [--servers batched]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
FEATURES = (1403, 1496, 6, 2019)  # pirate, dish, Paris, and a busy one (fires on 22% of tokens)
TOPICS = ("the sea", "a city", "the mountains", "a dinner", "music", "a ship", "Paris", "rain")
ASKED = iter(range(10**9))  # every request its own prompt: no mode is served from the cache


def cluster() -> dict:
    return {
        "kind": "mistudio.cluster-definition",
        "schema_version": "1",
        "name": "bench-cluster",
        "sae": {"layer": 12, "n_features": 2048},
        "members": [{"feature_idx": f, "strength": 0, "max_activation": 30.0} for f in FEATURES],
    }


def circuit() -> dict:
    member = [
        {"layer": 12, "feature": {"feature_idx": f, "strength": 0, "max_activation": 30.0}}
        for f in FEATURES
    ]
    edges = [
        {"up": {"layer": 12, "feature_idx": a}, "down": {"layer": 12, "feature_idx": b}}
        for a, b in zip(FEATURES, FEATURES[1:], strict=False)
    ]
    return {
        "kind": "mistudio.circuit-definition",
        "schema_version": "1",
        "name": "bench-circuit",
        "saes": [{"layer": 12, "n_features": 2048}],
        "members": member,
        "edges": edges,
    }


def imported(client: httpx.Client, what: str, doc: dict) -> str:
    response = client.post(
        f"/api/{what}/import", content=json.dumps(doc), headers={"content-type": "application/json"}
    )
    response.raise_for_status()
    body = response.json()
    return (body["data"][0] if "data" in body else body)["id"]


def arm(client: httpx.Client, mode: str, ids: dict) -> None:
    """Make `mode` what the server senses."""
    if mode == "circuit armed":
        client.post(
            f"/api/circuits/{ids['circuit']}/activate", json={"acknowledge_rung": True}
        ).raise_for_status()
        return
    client.post(f"/api/clusters/{ids['cluster']}/activate").raise_for_status()
    switch = "enable" if mode == "cluster armed" else "disable"
    client.post(f"/api/sensing/{ids['cluster']}/{switch}").raise_for_status()


def rate(client: httpx.Client, streams: int, tokens: int) -> float:
    """Completion tokens per second over `streams` concurrent requests."""

    def one(topic: str) -> int:
        prompt = f"Story {next(ASKED)}: write a long story about {topic}."
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": tokens, "temperature": 0}  # fmt: skip
        answer = client.post("/v1/chat/completions", json=body, timeout=600)
        answer.raise_for_status()
        return answer.json()["usage"]["completion_tokens"]

    began = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        made = sum(pool.map(one, TOPICS[:streams]))
    return made / (time.perf_counter() - began)


def measure(batched: bool, tokens: int, repeats: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    env = {"ENABLE_CONTINUOUS_BATCHING": "true" if batched else "false"}
    server = ServerProcess(home, ["--log-level", "warning"], env=env).wait_ready(timeout=600)
    results: dict[tuple[str, int], list[float]] = {}
    try:
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            ids = {"cluster": imported(client, "clusters", cluster()),
                   "circuit": imported(client, "circuits", circuit())}  # fmt: skip
            client.post(f"/api/circuit-sensing/{ids['circuit']}/enable").raise_for_status()
            rate(client, 2, 16)  # warm-up
            for _ in range(repeats):
                for streams in (1, 8):
                    for mode in ("nothing armed", "cluster armed", "circuit armed"):
                        arm(client, mode, ids)
                        results.setdefault((mode, streams), []).append(
                            rate(client, streams, tokens)
                        )
            sensed = client.get("/api/sensing/status").json()["events_recorded_since_start"]
            edges = client.get("/api/circuit-sensing/status").json()["events_recorded_since_start"]
    finally:
        server.stop()
    return {"results": results, "events": (sensed, edges)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", choices=["both", "serial", "batched"], default="both")
    args = parser.parse_args()
    print(f"\n{MODEL}, demo SAE (layer 12, TopK), {args.tokens} greedy tokens a stream, median of "
          f"{args.repeats}")  # fmt: skip
    print("| server | streams | nothing armed tok/s | cluster armed | circuit armed |")
    print("|---|---:|---:|---:|---:|")
    kinds = {"both": (False, True), "serial": (False,), "batched": (True,)}[args.servers]
    for batched in kinds:
        measured = measure(batched, args.tokens, args.repeats)
        results = measured["results"]
        for streams in (1, 8):
            base = statistics.median(results[("nothing armed", streams)])
            cells = [f"{base:.1f}"]
            for mode in ("cluster armed", "circuit armed"):
                value = statistics.median(results[(mode, streams)])
                cells.append(f"{value:.1f} ({value / base:.3f}x)")
            print(f"| {'batched' if batched else 'serial'} | {streams} | {' | '.join(cells)} |")
        co, edge = measured["events"]
        print(f"(events recorded: {co} co-activation, {edge} edge)")
    print("(goal: armed >= 0.95x of nothing armed at 8 streams)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
