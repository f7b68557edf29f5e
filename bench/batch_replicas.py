"""One batch drained by one replica, then by two on one PostgreSQL database. One run, one table.

The script starts a throwaway PostgreSQL cluster (tests/support/postgres.py) and real `millm
serve` processes on it, each serving the tests' tiny random-weight Llama (3 layers, d_model 64,
built here in a second), so the model's arithmetic is not what limits a replica: its serving
path is. Each replica is pinned to a core of its own (os.sched_setaffinity before it starts;
its threads inherit it) with one torch thread (OMP_NUM_THREADS=1), as a replica on a machine of
its own would be: the one-replica run uses core 0, the two-replica run cores 0 and 1
(PostgreSQL and this client share the machine's cores with them, in both runs).

Each run makes a fresh batch of --rows scoring rows (`/v1/completions`, `max_tokens: 1`,
`logprobs: 5`, different prompts) through replica A and times, with time.perf_counter() on
the client, the create to the batch's `completed` (polled every 0.1 s). Rows per second are
rows over that time; the output lines' `replica_id` give each replica's share. The goal
(issue 49): two replicas >= 1.7x one.

    .venv/bin/python bench/batch_replicas.py [--rows 4000]
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.batch_throughput import batch, output_lines, rows  # noqa: E402
from bench.replicas import build_tiny  # noqa: E402
from tests.support.postgres import PostgresServer  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def pinned_replica(home: Path, model: Path, url: str, core: int) -> ServerProcess:
    """A replica started on one core (the affinity its process inherits), one torch thread."""
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        env = {"DATABASE_URL": url, "OMP_NUM_THREADS": "1"}
        return ServerProcess(home, ["--model", str(model)], env=env, allowed=[model], fork=False)
    finally:
        os.sched_setaffinity(0, everywhere)


def drain(client: httpx.Client, bodies: list[dict]) -> tuple[float, dict, list[dict]]:
    """Seconds from creating a batch of `bodies` to its end; the batch; its output lines."""
    seconds, ended = batch(client, bodies)
    return seconds, ended, output_lines(client, ended)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4000)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        model, _ = build_tiny(work, 0)
        for count in (1, 2):
            postgres = PostgresServer()
            replicas: list[ServerProcess] = []
            try:
                for core in range(count):
                    home = work / f"run{count}-replica{core}"
                    replicas.append(pinned_replica(home, model, postgres.url, core))
                for replica in replicas:
                    replica.wait_ready()
                client = httpx.Client(base_url=replicas[0].base_url, timeout=600)
                name = client.get("/v1/models").json()["data"][0]["id"]
                bodies = rows(name, args.rows)
                drain(client, bodies[:64])  # warm-up: every replica's first requests
                seconds, batch, output = drain(client, bodies)
                shares = collections.Counter(o["response"]["millm"]["replica_id"] for o in output)
                once = sorted(o["custom_id"] for o in output) == sorted(
                    f"r{i}" for i in range(args.rows)
                )
                results[count] = (seconds, batch["request_counts"], sorted(shares.values()), once)
            finally:
                for replica in replicas:
                    replica.stop()
                postgres.stop()
    machine = platform.processor() or platform.machine()
    print(f"millm batch drained by replicas, {args.rows} scoring rows, tiny Llama, {machine}")
    print("| replicas | wall s | rows/s | lines per replica | every line once |")
    print("|---|---|---|---|---|")
    for count, (seconds, counts, shares, once) in results.items():
        assert counts["completed"] == args.rows, counts
        print(f"| {count} | {seconds:.1f} | {args.rows / seconds:.1f} | "
              f"{' / '.join(map(str, shares))} | {once} |")  # fmt: skip
    speedup = results[1][0] / results[2][0]
    print(f"two replicas / one: {speedup:.2f}x")


if __name__ == "__main__":
    main()
