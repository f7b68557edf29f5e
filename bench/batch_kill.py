"""kill -9 in the middle of a batch, --runs times: does every line come out exactly once? One run,
one table.

Each run starts a real `millm serve` on the tests' tiny random-weight Llama (built here; SQLite
store in a fresh data directory), uploads a --lines-line completions batch (`max_tokens: 4`,
different prompts), creates the batch, waits a random 0.2-3 s after the first chunk is recorded
(random.Random(--seed)), sends SIGKILL, starts the server again on the same data directory and
waits for the batch to end. It then reads the output and error files and counts each
`custom_id`: the run passes when the batch `completed` and every one of the --lines ids appears
exactly once across both files.

    .venv/bin/python bench/batch_kill.py [--runs 10] [--lines 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.replicas import build_tiny  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def start(home: Path, model: Path) -> tuple[ServerProcess, httpx.Client]:
    server = ServerProcess(home, ["--model", str(model)], allowed=[model], fork=False)
    server.wait_ready()
    return server, httpx.Client(base_url=server.base_url, timeout=120)


def create(client: httpx.Client, model: str, lines: int) -> str:
    rows = "".join(
        json.dumps({"custom_id": f"k{i}", "method": "POST", "url": "/v1/completions",
                    "body": {"model": model, "prompt": f"Line {i} says", "max_tokens": 4}})
        + "\n"
        for i in range(lines)
    )  # fmt: skip
    stored = client.post(
        "/v1/files", files={"file": ("rows.jsonl", rows.encode())}, data={"purpose": "batch"}
    ).json()
    made = client.post("/v1/batches", json={"input_file_id": stored["id"],
                       "endpoint": "/v1/completions", "completion_window": "24h"})  # fmt: skip
    return made.json()["id"]


def ids_in(client: httpx.Client, file_id: str | None) -> list[str]:
    if file_id is None:
        return []
    text = client.get(f"/v1/files/{file_id}/content").text
    return [json.loads(line)["custom_id"] for line in text.splitlines()]


def one_run(work: Path, model: Path, lines: int, wait_s: float) -> dict:
    home = Path(tempfile.mkdtemp(dir=work))
    server, client = start(home, model)
    name = client.get("/v1/models").json()["data"][0]["id"]
    batch_id = create(client, name, lines)
    while client.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"] == 0:
        time.sleep(0.02)
    time.sleep(wait_s)
    before = client.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"]
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    began = time.perf_counter()
    server, client = start(home, model)
    try:
        while (batch := client.get(f"/v1/batches/{batch_id}").json())["status"] not in (
            "completed", "failed", "cancelled", "expired"):  # fmt: skip
            time.sleep(0.2)
        seen = collections.Counter(
            ids_in(client, batch["output_file_id"]) + ids_in(client, batch["error_file_id"])
        )
    finally:
        server.stop()
    expected = {f"k{i}" for i in range(lines)}
    return {
        "status": batch["status"],
        "completed_at_kill": before,
        "after_restart_s": time.perf_counter() - began,
        "missing": len(expected - seen.keys()),
        "twice": sum(1 for count in seen.values() if count > 1),
        "unknown": len(seen.keys() - expected),
        "completed": batch["request_counts"]["completed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chance = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        model, _ = build_tiny(work, 0)
        for _ in range(args.runs):
            results.append(one_run(work, model, args.lines, chance.uniform(0.2, 3.0)))
    machine = platform.processor() or platform.machine()
    print(f"millm batch kill -9, {args.runs} runs of {args.lines} lines, tiny Llama, {machine}")
    print("| run | completed at the kill | status | completed | missing | twice | seconds after "
          "the restart |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n, r in enumerate(results, 1):
        print(f"| {n} | {r['completed_at_kill']} | {r['status']} | {r['completed']} | "
              f"{r['missing']} | {r['twice']} | {r['after_restart_s']:.1f} |")  # fmt: skip
    passed = sum(
        1 for r in results
        if r["status"] == "completed" and not (r["missing"] or r["twice"] or r["unknown"])
    )  # fmt: skip
    print(f"every custom_id exactly once: {passed} of {args.runs} runs")


if __name__ == "__main__":
    main()
