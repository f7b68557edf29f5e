"""Many concurrent clients against a small queue, serial and batched: each request completes whole
or is refused at once with 503 queue_full; no stream is cut or carries another's tokens; the
server serves normally afterwards."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.api.clients import MODEL, post, sse_events
from tests.support.server import ServerProcess

CLIENTS = 24
WORDS = [
    "river",
    "stone",
    "cloud",
    "lamp",
    "field",
    "bread",
    "glass",
    "horse",
    "paper",
    "storm",
    "shell",
    "tower",
]


@pytest.fixture(scope="module", params=["serial", "batched"])
def server(request, tiny_dirs, tmp_path_factory):
    env = {
        "MAX_PENDING_REQUESTS": "2",
        "ENABLE_CONTINUOUS_BATCHING": "1" if request.param == "batched" else "0",
        "MAX_BATCH_SIZE": "3",
    }
    process = ServerProcess(
        tmp_path_factory.mktemp(f"pressure-{request.param}"),
        ["--model", str(tiny_dirs["llama"])],
        env=env,
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def body(i: int) -> dict:
    words = f"{WORDS[i % len(WORDS)]} {WORDS[(i * 5 + 1) % len(WORDS)]} {i}"
    return {
        "model": MODEL,
        "prompt": f"Write about {words}:",
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
    }


def run(server, i: int) -> tuple[int, str | None, str]:
    """(status, error code, streamed text); a 200 must be a whole stream ending in [DONE]."""
    with httpx.Client(timeout=120) as client:
        response = client.post(f"{server.base_url}/v1/completions", json=body(i))
    if response.status_code != 200:
        return response.status_code, response.json()["error"]["code"], ""
    events = sse_events(response.text)
    assert events[-1] == "[DONE]", f"stream {i} was cut: {response.text[-300:]}"
    assert not any(isinstance(e, dict) and "error" in e for e in events), response.text
    finishes = [
        e["choices"][0]["finish_reason"]
        for e in events[:-1]
        if e["choices"] and e["choices"][0]["finish_reason"]
    ]
    assert len(finishes) == 1
    return 200, None, "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])


def test_overload_is_refused_at_once_and_every_admitted_stream_is_whole(server):
    expected = {i: run(server, i)[2] for i in range(CLIENTS)}  # each prompt alone, one at a time
    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(lambda i: run(server, i), range(CLIENTS)))
    refused = [i for i, (status, _, _) in enumerate(results) if status != 200]
    served = [i for i, (status, _, _) in enumerate(results) if status == 200]
    # the bound was really reached, and work still went through
    assert refused and served, results[:3]
    for i in refused:
        assert results[i][:2] == (503, "queue_full")
    for i in served:
        assert results[i][2] == expected[i], f"stream {i} differs from its answer alone"
    # The server is whole afterwards: a normal request answers, nothing is left queued or running.
    after = post(server, "/v1/completions", {**body(0), "stream": False})
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == expected[0]
    health = httpx.get(f"{server.base_url}/api/health/inference").json()
    assert health["queue_depth"] == 0 and health["running_rows"] == 0
    failed = sum(counts["failed"] for counts in health["jobs"].values())
    assert failed == 0
