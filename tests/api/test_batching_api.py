"""Continuous batching on a live server (tiny Llama, ENABLE_CONTINUOUS_BATCHING=1): concurrent
streams equal their solo answers, steered rows stay steered while scoring and embeddings beside
them stay unsteered, seeded requests take the serial path with the spec's best-effort scope,
response_format is refused, and /api/health/inference reports it all."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.api.clients import MODEL, post, sse_events
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens

LONG = 400  # tokens: a steered row that outlasts a scoring and an embedding request beside it
TOPICS = ["the sea", "a city at night", "old trees", "the moon", "a quiet street", "winter"]


def inference(server) -> dict:
    return httpx.get(f"{server.base_url}/api/health/inference", timeout=30).json()


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    home = tmp_path_factory.mktemp("batched-home")
    sae_dir = build_saelens(tmp_path_factory.mktemp("batched-sae") / "sae", layer=1, seed=21)
    env = {"ENABLE_CONTINUOUS_BATCHING": "1", "MAX_BATCH_SIZE": "8"}
    process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])], env=env)
    try:
        process.wait_ready()
        sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{sae}/attach", {}).status_code == 200
        profile = {
            "name": "loud",
            "description": "t",
            "steering": [{"sae_id": sae, "features": [{"index": 0, "strength": 60.0}]}],
        }
        assert post(process, "/api/profiles", profile).status_code == 201
        yield process
    finally:
        process.stop()


def chat(topic: str, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell me about {topic}."}],
        "max_tokens": 24,
        "temperature": 0,
        **extra,
    }


def streamed_text(server, body: dict) -> tuple[str, list, httpx.Headers]:
    """The whole streamed answer, its events and the response headers."""
    response = post(server, "/v1/chat/completions", {**body, "stream": True})
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    )
    return text, events, response.headers


def test_concurrent_streams_each_equal_their_solo_answer(server):
    solo = [streamed_text(server, chat(topic))[0] for topic in TOPICS]
    before = inference(server)
    assert before["peak_batch_size"] == 1  # one at a time so far
    with ThreadPoolExecutor(len(TOPICS)) as pool:
        together = list(pool.map(lambda topic: streamed_text(server, chat(topic))[0], TOPICS))
    assert together == solo  # whole, in order, nobody else's tokens
    # A poll of `batch_size` can miss short rows on a busy machine; the peak cannot.
    assert 2 <= inference(server)["peak_batch_size"] <= len(TOPICS)
    health = inference(server)
    assert health["backend"] == "batched" and health["continuous_batching"]["enabled"] is True
    assert health["runner"] == "lean (llama)"
    assert health["jobs"]["batched"]["served"] == before["jobs"]["batched"]["served"] + len(TOPICS)
    assert health["queue_depth"] == 0 and health["running_rows"] == 0 and health["in_flight"] == 0
    assert health["background_waiting"] == 0


def test_steered_rows_stay_steered_while_scoring_and_embeddings_beside_them_do_not(server):
    prompt = "The quiet street"
    scoring = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "logprobs": 5}
    reference_scores = post(server, "/v1/completions", scoring).json()["choices"][0]["logprobs"]
    reference_vector = post(server, "/v1/embeddings", {"model": MODEL, "input": prompt}).json()[
        "data"
    ][0]["embedding"]
    plain = streamed_text(server, chat("the sea", max_tokens=LONG))[0]
    steered_alone, events, _ = streamed_text(
        server, chat("the sea", max_tokens=LONG, profile="loud")
    )
    assert steered_alone != plain and member(events[-2]["millm_steering"])[0] == "profile"

    # Scoring and embeddings run between batch steps, so they are "beside" the steered row only if
    # it joined the batch before they were sent and is still there once both have answered (it is
    # the only generation in flight, and a row never rejoins). The row is long so that a slow CI
    # machine's round trips fit inside it (60 tokens did not, in CI); a few tries for the rest.
    def steered(into: dict):
        into["steered"] = streamed_text(server, chat("the sea", max_tokens=LONG, profile="loud"))[0]

    beside = False
    for _ in range(5):
        results: dict = {}
        thread = threading.Thread(target=steered, args=(results,))
        thread.start()
        deadline = time.monotonic() + 30
        while (joined := inference(server)["batch_size"]) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        scored = post(server, "/v1/completions", scoring)
        vector = post(server, "/v1/embeddings", {"model": MODEL, "input": prompt}).json()["data"][
            0
        ]["embedding"]
        still = inference(server)["batch_size"]
        thread.join(60)
        assert scored.headers["x-millm-steering"] == "none"
        assert scored.json()["choices"][0]["logprobs"] == reference_scores
        assert vector == reference_vector
        assert results["steered"] == steered_alone
        if joined >= 1 and still >= 1:
            beside = True
            break
    assert beside, (
        "the steered row left the batch before scoring and embeddings answered, in every try"
    )


def test_seeded_requests_take_the_serial_path_with_a_best_effort_promise(server):
    body = chat("the moon", temperature=1.0, seed=7, max_tokens=16)
    before = inference(server)["jobs"]
    first = post(server, "/v1/chat/completions", body)
    second = post(server, "/v1/chat/completions", body)
    assert first.status_code == 200 and first.headers["x-millm-seed"] == '7;scope="best-effort"'
    assert first.json()["choices"][0]["message"] == second.json()["choices"][0]["message"]
    after = inference(server)["jobs"]
    assert after["serial"]["served"] == before["serial"]["served"] + 2
    assert after["batched"]["served"] == before["batched"]["served"]
    _, _, headers = streamed_text(server, chat("the moon"))
    assert "x-millm-seed" not in headers


def test_response_format_is_refused_while_batching_is_enabled(server):
    response = post(
        server, "/v1/chat/completions", chat("winter", response_format={"type": "json_object"})
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (
        error["code"] == "response_format_unsupported" and "continuous batching" in error["message"]
    )
    assert (
        post(
            server, "/v1/chat/completions", chat("winter", response_format={"type": "text"})
        ).status_code
        == 200
    )


def test_a_client_leaving_mid_stream_frees_its_row_and_the_others_finish(server):
    expected = streamed_text(server, chat("old trees", max_tokens=80))[0]
    before = inference(server)["jobs"]["batched"]["cancelled"]
    kept = {}
    thread = threading.Thread(
        target=lambda: kept.setdefault(
            "text", streamed_text(server, chat("old trees", max_tokens=80))[0]
        )
    )
    thread.start()
    body = {**chat("a city at night", max_tokens=1000), "stream": True}
    with httpx.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60
    ) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 6:
                break  # leave mid-stream
    thread.join(60)
    assert kept["text"] == expected
    deadline = time.monotonic() + 30
    while (
        inference(server)["jobs"]["batched"]["cancelled"] == before and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert inference(server)["jobs"]["batched"]["cancelled"] == before + 1


def test_sae_activation_requests_take_the_serial_path(server):
    before = inference(server)["jobs"]
    body = chat(
        "the sea", max_tokens=6, return_sae_activations={"positions": "completion", "top_k": 2}
    )
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert len(response.json()["millm"]["sae_activations"]["positions"]) == 5
    after = inference(server)["jobs"]
    assert after["serial"]["served"] == before["serial"]["served"] + 1
    assert after["batched"]["served"] == before["batched"]["served"]
