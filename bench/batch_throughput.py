"""A scoring batch against the same rows sent by 8 concurrent clients, and a chat beside the
batch. One run, one table.

The script starts a real `millm serve` on the demo model (or --model PATH) with its own data
directory and makes --rows scoring rows: `/v1/completions` with `max_tokens: 1` and
`logprobs: 5`, prompts of a few dozen tokens that differ row to row (so the prefix cache does
not serve one from another). Then, timed with time.perf_counter() on the client:

  1. synchronous: the rows sent by 8 threads, each its share one request after another;
  2. chat on the idle server: a streamed chat's time to its first text, --probes times;
  3. batch: the same rows as one JSONL file through POST /v1/files and /v1/batches, from the
     create to the batch's `completed` (polled every 0.1 s), while a thread sends the same chat
     --probes times, one a second from 1 s after the create (the chat beside the batch), and
     counts the lines the batch completed while the chats ran.

Rows per second are rows over wall time. The goal (issue 49): the batch at >= 0.9x the
synchronous rows per second, and the chat's median time to first text within 1.5x of idle.

    .venv/bin/python bench/batch_throughput.py [--rows 2000] [--probes 10] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

WORDS = ["river", "mountain", "ship", "harbour", "bread",
         "garden", "lantern", "violin", "meadow", "glacier"]  # fmt: skip
CLIENTS = 8


def prompt(i: int) -> str:
    """A few dozen tokens, different for every row."""
    picked = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(12)]
    return f"Row {i}: the " + " and the ".join(picked) + " were all that the traveller saw"


def rows(model: str, n: int) -> list[dict]:
    return [
        {"model": model, "prompt": prompt(i), "max_tokens": 1, "logprobs": 5, "temperature": 0}
        for i in range(n)
    ]


def synchronous(client: httpx.Client, bodies: list[dict]) -> float:
    """Seconds for CLIENTS threads to send every body."""
    shares = [bodies[k::CLIENTS] for k in range(CLIENTS)]

    def send(share: list[dict]) -> None:
        for body in share:
            client.post("/v1/completions", json=body).raise_for_status()

    threads = [threading.Thread(target=send, args=(share,)) for share in shares]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def batch(
    client: httpx.Client, bodies: list[dict], created=lambda made: None, **create
) -> tuple[float, dict]:
    """Seconds from creating a `/v1/completions` batch of `bodies` (custom_ids r0, r1, ...; the
    create body's extra fields `create`) to its end, and the ended batch (`created(batch)` is
    called once it is made)."""
    lines = "".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": b})
        + "\n"
        for i, b in enumerate(bodies)
    )
    stored = client.post(
        "/v1/files", files={"file": ("rows.jsonl", lines.encode())}, data={"purpose": "batch"}
    ).json()
    began = time.perf_counter()
    made = client.post(
        "/v1/batches",
        json={
            "input_file_id": stored["id"],
            "endpoint": "/v1/completions",
            "completion_window": "24h",
            **create,
        },
    ).json()
    created(made)
    while True:
        got = client.get(f"/v1/batches/{made['id']}").json()
        if got["status"] in ("completed", "failed", "cancelled", "expired"):
            return time.perf_counter() - began, got
        time.sleep(0.1)


def output_lines(client: httpx.Client, batch: dict) -> list[dict]:
    """An ended batch's output lines, in input order."""
    text = client.get(f"/v1/files/{batch['output_file_id']}/content").text
    return [json.loads(line) for line in text.splitlines()]


def first_text(client: httpx.Client, model: str) -> float:
    """Milliseconds from sending a streamed chat to its first text."""
    body = {"model": model, "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 4, "temperature": 0, "stream": True}  # fmt: skip
    began = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        for frame in response.iter_lines():
            if frame.startswith("data: {") and '"content":"' in frame.replace(" ", ""):
                chunk = json.loads(frame[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    return (time.perf_counter() - began) * 1000
    return (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        server = ServerProcess(
            Path(home), ["--model", str(args.model)] if args.model else [], allowed=[Path(home)]
        ).wait_ready()
        try:
            client = httpx.Client(base_url=server.base_url, timeout=600)
            model = client.get("/v1/models").json()["data"][0]["id"]
            bodies = rows(model, args.rows)
            synchronous(client, bodies[:64])  # warm-up
            sync_s = synchronous(client, bodies)
            idle = [first_text(client, model) for _ in range(args.probes)]
            beside: list[float] = []
            window: list[tuple[float, int]] = []  # (time, lines completed) as the chats begin, end

            def probe(made: dict) -> None:
                def completed() -> tuple[float, int]:
                    got = client.get(f"/v1/batches/{made['id']}").json()
                    return time.perf_counter(), got["request_counts"]["completed"]

                time.sleep(1.0)
                window.append(completed())
                for _ in range(args.probes):
                    beside.append(first_text(client, model))
                    time.sleep(1.0)
                window.append(completed())

            prober: list[threading.Thread] = []

            def start(made: dict) -> None:
                prober.append(threading.Thread(target=probe, args=(made,)))
                prober[0].start()

            batch_s, ended = batch(client, bodies, start)
            prober[0].join()
        finally:
            server.stop()
    counts = ended["request_counts"]
    machine = platform.processor() or platform.machine()
    print(f"millm batch throughput, {args.rows} scoring rows, {machine}")
    print(f"batch: {counts['completed']} completed, {counts['failed']} failed")
    print("| | wall s | rows/s |")
    print("|---|---|---|")
    print(f"| {CLIENTS} concurrent synchronous clients | {sync_s:.1f} | {args.rows / sync_s:.1f} |")
    print(f"| one batch | {batch_s:.1f} | {args.rows / batch_s:.1f} |")
    print(f"batch / synchronous: {(args.rows / batch_s) / (args.rows / sync_s):.2f}x")
    med_idle, med_beside = statistics.median(idle), statistics.median(beside)
    print(f"chat time to first text, median of {args.probes}: idle {med_idle:.0f} ms, "
          f"beside the batch {med_beside:.0f} ms ({med_beside / med_idle:.2f}x); slowest "
          f"{max(idle):.0f} ms idle, {max(beside):.0f} ms beside")  # fmt: skip
    (t0, n0), (t1, n1) = window
    print(f"the batch while the chats ran: {(n1 - n0) / (t1 - t0):.1f} rows/s over {t1 - t0:.0f} s "
          f"({(n1 - n0) / (t1 - t0) / (args.rows / sync_s):.2f}x synchronous)")  # fmt: skip


if __name__ == "__main__":
    main()
