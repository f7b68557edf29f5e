"""Readiness, model listing, backpressure and client disconnects on live servers."""

import json
import threading
import time

import httpx
import openai
import pytest

from tests.api.clients import MODEL, post, sdk
from tests.support.server import ServerProcess

USER = [{"role": "user", "content": "Tell me a long story."}]


def inference_stats(server):
    return httpx.get(f"{server.base_url}/api/health/inference").json()


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except httpx.TransportError:  # the server is not listening yet
            pass
        time.sleep(0.05)
    return False


def test_health_and_readiness(llama_server):
    assert httpx.get(f"{llama_server.base_url}/api/health").json() == {"status": "ok"}
    ready = httpx.get(f"{llama_server.base_url}/api/health/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_models_list_and_get(llama_server):
    client = sdk(llama_server)
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].owned_by == "local" and models[0].object == "model"
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_openapi_schema_lists_the_surface(llama_server):
    schema = httpx.get(f"{llama_server.base_url}/openapi.json").json()
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/api/health",
        "/api/health/ready",
        "/api/health/inference",
        "/api/models",
        "/api/monitoring",
        "/api/monitoring/stream",
    ):
        assert path in schema["paths"]


def test_the_cards_are_read_from_nvidia_smi_or_their_absence_said(llama_server):
    body = httpx.get(f"{llama_server.base_url}/api/health/gpus").json()
    assert set(body) == {"read_at", "cards", "reason"}
    if not body["cards"]:  # a machine without nvidia-smi (or without a card)
        assert body["reason"] == "nvidia-smi unavailable"
    # The tiny model runs on the CPU: no card holds anything of this process.
    assert all(card["torch_measured"] is False for card in body["cards"])


def test_model_that_fails_to_load(tiny_dirs, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_dirs["llama"] / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    server = ServerProcess(tmp_path / "home", ["--model", str(broken)])
    try:
        assert wait_for(
            lambda: (
                httpx.get(f"{server.base_url}/api/health/ready").json().get("status") == "error"
            ),
            120,
        )
        ready = httpx.get(f"{server.base_url}/api/health/ready")
        assert ready.status_code == 503 and "could not load model" in ready.json()["error"]
        assert ready.headers["retry-after"] == "5"
        response = post(server, "/v1/chat/completions", {"model": "broken-model", "messages": USER})
        assert response.status_code == 503
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "model_not_loaded" and "could not load model" in error["message"]
        assert httpx.get(f"{server.base_url}/v1/models").json()["data"] == []
    finally:
        server.stop()


@pytest.fixture(scope="module")
def small_queue_server(tiny_dirs, tmp_path_factory):
    server = ServerProcess(
        tmp_path_factory.mktemp("queue-home"),
        ["--model", str(tiny_dirs["llama"])],
        env={"MAX_PENDING_REQUESTS": "1"},
    )
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def test_queue_full_at_once_and_everything_admitted_completes(small_queue_server):
    results = []

    def call(i):
        stream = i % 2 == 1
        body = {
            "model": MODEL,
            "messages": USER,
            "max_tokens": 200,
            "temperature": 0,
            "n": 1 if stream else 4,
            "stream": stream,
        }
        response = post(small_queue_server, "/v1/chat/completions", body)
        results.append(response)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    statuses = sorted(r.status_code for r in results)
    assert statuses.count(503) >= 1 and statuses.count(200) >= 2 and set(statuses) == {200, 503}
    for response in results:
        if response.status_code == 503:
            assert response.json()["error"]["code"] == "queue_full"
            # No job has finished when the queue first fills: the default wait.
            assert 1 <= int(response.headers["retry-after"]) <= 60
        elif response.headers["content-type"].startswith("text/event-stream"):
            # the last chunk before [DONE] says what steered the stream (millm_steering)
            frames = [f[6:] for f in response.text.split("\n\n") if f]
            assert (
                frames[-1] == "[DONE]" and json.loads(frames[-3])["usage"]["completion_tokens"] > 0
            )
        else:
            choices = response.json()["choices"]
            assert len(choices) == 4 and all(
                c["finish_reason"] in ("stop", "length") for c in choices
            )
    # The server serves normally afterwards.
    assert (
        post(
            small_queue_server,
            "/v1/chat/completions",
            {"model": MODEL, "messages": USER, "max_tokens": 2},
        ).status_code
        == 200
    )


def test_stream_disconnect_cancels_the_generation(llama_server):
    before = inference_stats(llama_server)["jobs"]["serial"]["cancelled"]
    body = {"model": MODEL, "messages": USER, "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.stream(
        "POST", f"{llama_server.base_url}/v1/chat/completions", json=body, timeout=60
    ) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    assert wait_for(
        lambda: inference_stats(llama_server)["jobs"]["serial"]["cancelled"] == before + 1
    )
    assert wait_for(lambda: inference_stats(llama_server)["running_rows"] == 0)


def test_non_stream_disconnect_cancels_the_generation(llama_server):
    before = inference_stats(llama_server)["jobs"]["serial"]["cancelled"]
    # 16 rows of up to 2000 tokens: about a second on a fast Zen 5 (8 rows took 0.76 s there, too
    # close to a 0.5 s wait), so the client leaves well before the answer
    body = {"model": MODEL, "messages": USER, "max_tokens": 2000, "temperature": 0, "n": 16}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{llama_server.base_url}/v1/chat/completions", json=body, timeout=0.2)
    assert wait_for(
        lambda: inference_stats(llama_server)["jobs"]["serial"]["cancelled"] == before + 1
    )
    assert wait_for(lambda: inference_stats(llama_server)["running_rows"] == 0)
