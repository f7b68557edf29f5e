"""The prefix cache on live servers (tiny float32 Llama): a repeated prompt reuses its keys and
values and says so in usage.prompt_tokens_details.cached_tokens, answers do not change, a finished
answer is reused by the next turn, steering keeps its own cache, SAE reads stay exact,
PREFIX_CACHE_BYTES=0 and an unload leave nothing behind, and a long prompt joining a running batch
is prefilled in chunks while the running stream keeps flowing.

Three servers start together: `cached` (the default cache, serial), `off` (PREFIX_CACHE_BYTES=0, the
reference that never reuses anything) and `batched` (continuous batching, PREFILL_CHUNK_TOKENS=16).
Each runs torch on one thread: three servers share this machine's cores, and oversubscribed
OpenMP threads make every step many times slower (seen: 80 ms instead of 2 ms per decode step).
"""

from __future__ import annotations

import json
import math
import threading
import time

import httpx
import pytest

from tests.api.clients import MODEL, answer_events, api, post, sse_events
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens

BLOCK = 16  # tokens per cache block (health reports it as block_tokens)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
SERVERS = {
    "cached": {},
    "off": {"PREFIX_CACHE_BYTES": "0"},
    "batched": {"ENABLE_CONTINUOUS_BATCHING": "1", "PREFILL_CHUNK_TOKENS": "16"},
}
# Attached on `cached` and `off`. With these weights, per-request steering of feature 6 at +150
# makes the tiny model repeat "is": an answer that re-tokenizes to the very ids it was generated as.
SAE_SEED = 21
REPEATING = (6, 150.0)
SENTENCE = (
    "The cat runs quickly. A river becomes the city of France. Sparse codes count one two "
    "three four five."
)


@pytest.fixture(scope="module")
def servers(tiny_dirs, tmp_path_factory):
    sae_dir = build_saelens(tmp_path_factory.mktemp("prefix-sae") / "sae", layer=1, seed=SAE_SEED)
    processes: dict[str, ServerProcess] = {}
    try:
        for (
            name,
            env,
        ) in SERVERS.items():  # all started before any is awaited: they load side by side
            processes[name] = ServerProcess(
                tmp_path_factory.mktemp(f"prefix-{name}"),
                ["--model", str(tiny_dirs["llama"])],
                env={**ONE_THREAD, **env},
            )
        for name, process in processes.items():
            process.wait_ready()
            if name != "batched":
                sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
                assert post(process, f"/api/saes/{sae}/attach", {}).status_code == 200
        yield processes
    finally:
        for process in processes.values():
            process.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers["cached"]


@pytest.fixture(scope="module")
def off(servers):
    return servers["off"]


@pytest.fixture(scope="module")
def batched(servers):
    return servers["batched"]


def inference(server) -> dict:
    return httpx.get(f"{server.base_url}/api/health/inference", timeout=30).json()


def counters(server) -> dict:
    return inference(server)["prefix_cache"]


def sae_id(server) -> str:
    (sae,) = api(server, "GET", "/api/saes").json()["data"]
    return sae["id"]


def chat(content: str, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
        **extra,
    }


def answer(server, body: dict, path: str = "/v1/chat/completions") -> dict:
    response = post(server, path, body)
    assert response.status_code == 200, response.text
    return {**response.json(), "headers": response.headers}


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def text(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def whole_blocks(tokens: int) -> int:
    return tokens // BLOCK * BLOCK


def reusable(prompt_tokens: int) -> int:
    """What a repeat of a cached prompt takes from the cache: its whole blocks, never its last
    position."""
    return whole_blocks(prompt_tokens - 1)


@pytest.mark.parametrize("which", ["cached", "batched"])
def test_a_repeated_request_reuses_whole_blocks_and_answers_the_same(servers, which):
    server = servers[which]
    body = chat("Every feature counts quickly. " * 6 + "Tell me more.", max_tokens=12)
    first = answer(server, body)
    before = counters(server)
    second = answer(server, body)
    after = counters(server)
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens > 2 * BLOCK
    assert cached(first) == 0
    reused = cached(second)
    assert reused == reusable(prompt_tokens)
    assert 0 < reused < prompt_tokens and reused % BLOCK == 0
    assert second["usage"]["prompt_tokens"] == prompt_tokens
    assert second["usage"]["completion_tokens"] == first["usage"]["completion_tokens"]
    assert second["choices"][0]["message"] == first["choices"][0]["message"]
    assert second["choices"][0]["finish_reason"] == first["choices"][0]["finish_reason"]
    assert after["enabled"] is True and after["block_tokens"] == BLOCK
    assert after["lookups"] == before["lookups"] + 1
    assert after["hits"] == before["hits"] + 1
    assert after["tokens_reused"] == before["tokens_reused"] + reused
    # The repeat's prompt and answer were stored by the first: nothing new.
    assert (after["tokens_stored"], after["blocks"], after["bytes"]) == (
        before["tokens_stored"],
        before["blocks"],
        before["bytes"],
    )
    assert 0 < after["bytes"] <= after["budget_bytes"]


def test_a_finished_answer_is_reused_token_for_token(server):
    """What a row fed (prompt, then every sampled token but the last) is stored when it finishes:
    a continuation sent as token ids reuses all of its whole blocks, the answer's included."""
    prompt = [1, *range(40, 80)]
    read = {"positions": "completion", "top_k": 1}
    first = answer(
        server,
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 40,
            "temperature": 0,
            "return_sae_activations": read,
        },
        "/v1/completions",
    )
    assert cached(first) == 0
    generated = first["usage"]["completion_tokens"]
    assert generated >= 2 * BLOCK, first["choices"][0]  # long enough to fill blocks past the prompt
    # The read's positions are the fed answer tokens, with their ids.
    fed = prompt + [p["token_id"] for p in first["millm"]["sae_activations"]["positions"]]
    assert len(fed) == len(prompt) + generated - 1
    second = answer(
        server,
        {"model": MODEL, "prompt": [*fed, 50, 51, 52], "max_tokens": 4, "temperature": 0},
        "/v1/completions",
    )
    assert cached(second) == whole_blocks(len(fed))
    assert cached(second) > len(prompt) + BLOCK


def test_the_next_chat_turn_reuses_the_answer(server):
    """A conversation's second turn starts with the first turn's prompt and answer. The tiny random
    model's plain answers are byte-level noise that does not re-tokenize to the ids it generated,
    so the turns are steered (the same steering both times) to an answer that does: a repeated
    word."""
    index, strength = REPEATING
    steering = {
        "steering": {
            "steering": [
                {"sae_id": sae_id(server), "features": [{"index": index, "strength": strength}]}
            ]
        }
    }
    question = "Tell me about the sea."
    first = answer(server, chat(question, max_tokens=48, **steering))
    prompt_tokens, generated = first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"]
    assert cached(first) == 0 and generated == 48
    history = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": text(first)},
        {"role": "user", "content": "And then?"},
    ]
    second = answer(server, {**chat(question, max_tokens=4, **steering), "messages": history})
    assert second["usage"]["prompt_tokens"] > prompt_tokens + generated
    assert cached(second) == whole_blocks(prompt_tokens + generated - 1)
    assert cached(second) >= prompt_tokens + 2 * BLOCK


def put_live(server, strength: float, index: int = 0) -> dict:
    response = api(
        server,
        "PUT",
        f"/api/steering/saes/{sae_id(server)}/features/{index}",
        json={"strength": strength},
    )
    assert response.status_code == 200 and response.json()["live"] is True, response.text
    return response.json()


def test_steered_rows_keep_their_own_cache(server, off):
    body = chat("The capital steers the city of France. " * 3, max_tokens=12)
    plain = answer(server, body)
    # unsteered blocks are there
    assert cached(answer(server, body)) == reusable(plain["usage"]["prompt_tokens"]) > 0
    reuse = reusable(plain["usage"]["prompt_tokens"])
    try:
        version = put_live(server, 60)["steering"]["version"]
        put_live(off, 60)
        steered = answer(server, body)
        assert member(steered["headers"]["x-millm-steering"])[1]["version"] == version
        assert cached(steered) == 0  # the unsteered prefix is not this row's
        reference = answer(off, body)
        assert cached(reference) == 0
        assert text(steered) == text(reference) != text(plain)
        again = answer(server, body)
        assert cached(again) == reuse and text(again) == text(steered)

        put_live(server, 30)
        weaker = answer(server, body)
        assert cached(weaker) == 0
        assert cached(answer(server, body)) == reuse

        put_live(server, 60)
        back = answer(server, body)
        assert cached(back) == reuse and text(back) == text(steered)

        # A request's own steering replaces the live steering: its own cache too.
        own = {
            "steering": {
                "steering": [{"sae_id": sae_id(server), "features": [{"index": 5, "strength": 40}]}]
            }
        }
        mine = answer(server, {**body, **own})
        assert member(mine["headers"]["x-millm-steering"])[0] == "inline"
        assert cached(mine) == 0
        mine_again = answer(server, {**body, **own})
        assert cached(mine_again) == reuse and text(mine_again) == text(mine)
    finally:
        for process in (server, off):
            api(process, "DELETE", "/api/steering/features")
    assert cached(answer(server, body)) == reuse  # steering off: the unsteered blocks again


def test_a_streamed_usage_chunk_reports_the_same_cached_tokens(server):
    body = chat("Sparse codes reads a small autoencoder. " * 3, max_tokens=10)
    answer(server, body)
    whole = answer(server, body)
    assert cached(whole) == reusable(whole["usage"]["prompt_tokens"]) > 0
    response = post(
        server,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert response.status_code == 200, response.text
    events = answer_events(sse_events(response.text))
    usage = events[-2]
    assert usage["choices"] == []
    assert usage["usage"] == whole["usage"]
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == cached(whole)
    streamed = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    )
    assert streamed == text(whole)


def test_n_choices_count_the_cached_prompt_once(server):
    body = chat("My friend writes one two three four five. " * 3, max_tokens=6)
    cold_pair = answer(server, {**body, "n": 2})
    assert cached(cold_pair) == 0
    single = answer(server, body)
    assert cached(single) == reusable(single["usage"]["prompt_tokens"]) > 0
    pair = answer(server, {**body, "n": 2})
    assert pair["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]
    assert cached(pair) == cached(single)
    assert [c["message"]["content"] for c in pair["choices"]] == [text(single)] * 2
    assert pair["usage"]["completion_tokens"] == 2 * single["usage"]["completion_tokens"]


def test_prefix_cache_bytes_zero_turns_it_off(off):
    health = inference(off)
    assert health["prefix_cache"] == {"enabled": False, "unavailable": "PREFIX_CACHE_BYTES is 0"}
    assert health["prefill_chunk_tokens"] == 512
    body = chat("The model answers the city of France. " * 3)
    first, second = answer(off, body), answer(off, body)
    assert first["usage"]["prompt_tokens"] > 2 * BLOCK
    assert cached(first) == 0 and cached(second) == 0
    assert text(first) == text(second)


def test_sae_reads_stay_exact_and_prompt_reads_never_use_the_cache(server, off):
    body = chat("A river answers a small autoencoder. " * 3, max_tokens=6)
    completion = {"positions": "completion", "top_k": 4}
    cold = answer(server, {**body, "return_sae_activations": completion})
    prompt_tokens = cold["usage"]["prompt_tokens"]
    assert cached(cold) == 0
    warm = answer(server, {**body, "return_sae_activations": completion})
    # a completion read may start from cached positions
    assert cached(warm) == reusable(prompt_tokens) > 0
    assert warm["millm"]["sae_activations"] == cold["millm"]["sae_activations"]
    assert text(warm) == text(cold)

    everything = answer(
        server, {**body, "return_sae_activations": {"positions": "all", "top_k": 4}}
    )
    assert cached(everything) == 0  # the prompt's positions are read: computed, not restored
    positions = everything["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in positions] == list(range(prompt_tokens + 5))
    assert positions[prompt_tokens:] == cold["millm"]["sae_activations"]["positions"]
    reference = answer(off, {**body, "return_sae_activations": {"positions": "all", "top_k": 4}})
    assert reference["millm"]["sae_activations"]["positions"] == positions
    prompt_only = answer(
        server, {**body, "return_sae_activations": {"positions": "prompt", "top_k": 4}}
    )
    assert cached(prompt_only) == 0
    assert prompt_only["millm"]["sae_activations"]["positions"] == positions[:prompt_tokens]
    # A range starting at 20 may take only the positions before it: one block.
    ranged = answer(
        server,
        {**body, "return_sae_activations": {"positions": {"start": 20, "end": 24}, "top_k": 4}},
    )
    assert cached(ranged) == BLOCK
    assert ranged["millm"]["sae_activations"]["positions"] == positions[20:24]


def timed_stream(server, body: dict, into: dict, started: threading.Event | None = None) -> None:
    """Stream a chat answer, keeping each event's arrival time (time.monotonic)."""
    events = []
    with httpx.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append((time.monotonic(), json.loads(line[len("data: ") :])))
            if (
                started is not None
                and sum(
                    1 for _, e in events if e["choices"] and e["choices"][0]["delta"].get("content")
                )
                >= 3
            ):
                started.set()
    into["events"] = events
    into["text"] = "".join(
        e["choices"][0]["delta"].get("content") or "" for _, e in events if e["choices"]
    )
    into["finish"] = next(
        e["choices"][0]["finish_reason"]
        for _, e in reversed(events)
        if e["choices"] and e["choices"][0].get("finish_reason")
    )


def test_a_long_prompt_joins_in_chunks_while_the_running_stream_flows(batched, off):
    health = inference(batched)
    assert health["prefill_chunk_tokens"] == 16 and health["backend"] == "batched"
    running = chat("Tell me about the sea.", max_tokens=200)
    joining = chat(" ".join([SENTENCE] * 24), max_tokens=8)
    solo_running, solo_joining = (
        text(answer(off, running)),
        text(answer(off, joining)),
    )  # never cached, never batched

    streams: dict = {"running": {}, "joining": {}}
    started = threading.Event()
    thread = threading.Thread(
        target=timed_stream, args=(batched, running, streams["running"], started)
    )
    thread.start()
    assert started.wait(60)
    timed_stream(batched, joining, streams["joining"])
    thread.join(120)
    assert streams["running"]["text"] == solo_running and streams["running"]["finish"] == "length"
    assert streams["joining"]["text"] == solo_joining

    # The joining stream's first chunk (the role) is sent once its job is submitted; its first token
    # comes after its whole prefill. A prefill run whole stalls the running row: it gets at most the
    # step or two around the join in that window (0-3 events, measured with
    # PREFILL_CHUNK_TOKENS=4096). In chunks of 16 the running row steps once per chunk.
    joined = [t for t, e in streams["joining"]["events"] if e["choices"]]
    submitted = joined[0]
    first_token = next(
        t
        for t, e in streams["joining"]["events"][1:]
        if e["choices"]
        and (e["choices"][0]["delta"].get("content") or e["choices"][0]["finish_reason"])
    )
    flowing = [
        t
        for t, e in streams["running"]["events"]
        if e["choices"] and e["choices"][0]["delta"].get("content")
    ]
    assert flowing[-1] > first_token, "the running stream ended before the long prompt joined"
    prompt_tokens = answer(batched, joining)["usage"]["prompt_tokens"]
    chunks = math.ceil(prompt_tokens / 16)
    during = sum(1 for t in flowing if submitted <= t <= first_token)
    assert during >= max(3, chunks // 4), (during, chunks)


def test_the_cache_goes_with_an_unload(server):
    """Last in this module: it unloads the model (and loads it again)."""
    body = chat("Paris reads the city of France. " * 3)
    answer(server, body)
    repeat = answer(server, body)
    assert cached(repeat) == reusable(repeat["usage"]["prompt_tokens"]) > 0
    assert counters(server)["blocks"] > 0
    unloaded = api(server, "POST", f"/api/models/{MODEL}/unload")
    assert unloaded.status_code == 200 and unloaded.json()["was_loaded"] is True, unloaded.text
    assert inference(server)["prefix_cache"] is None
    loaded = api(server, "POST", f"/api/models/{MODEL}/load")
    assert loaded.status_code == 200, loaded.text
    fresh = counters(server)
    assert fresh["enabled"] is True
    assert {
        k: fresh[k]
        for k in (
            "bytes",
            "blocks",
            "lookups",
            "hits",
            "tokens_reused",
            "tokens_stored",
            "evictions",
        )
    } == dict.fromkeys(
        ("bytes", "blocks", "lookups", "hits", "tokens_reused", "tokens_stored", "evictions"), 0
    )
    first = answer(server, body)
    assert cached(first) == 0 and text(first) == text(repeat)
    assert cached(answer(server, body)) == cached(repeat)
