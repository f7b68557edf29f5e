"""Model lifecycle under faults, on live servers: unload while requests run, a second load while
one is in progress, corrupt model directories, insufficient memory, unsupported quantization,
and an unload that outlasts GRACEFUL_UNLOAD_TIMEOUT — each with its exact status, and nothing
stored lost."""

import json
import threading
import time

import httpx
import pytest

from tests.api.clients import answer_events, api, post, sse_events
from tests.api.clients import error as shared_error
from tests.support import model_dirs
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

SLOW = (
    "slow"  # the tiny Llama without an end-of-sequence token: every generation runs to max_tokens
)
OTHER = "tiny-gemma2"
USER = [{"role": "user", "content": "Tell me a long story."}]
# MILLM_MEMORY_LIMIT_BYTES: the tiny models (~0.65 MB) fit, the wide one (~2.7 MB) does not
LIMIT = 2_000_000
LONG = 2000
# Running requests get this long to finish before an unload cuts them: far more than a 2000-token
# stream needs (about 3 s here), so a busy machine slows the test down but cannot fail it.
GRACEFUL = 300


def error(response, status, code, type_="invalid_request_error"):
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return shared_error(response, status, code, type_)


def states(server) -> dict[str, str]:
    return {m["id"]: m["state"] for m in api(server, "GET", "/api/models").json()["data"]}


def chat(server, model, **extra):
    body = {"model": model, "messages": USER, "max_tokens": 3, "temperature": 0, **extra}
    return post(server, "/v1/chat/completions", body)


def register(server, directory, name=None):
    return api(
        server,
        "POST",
        "/api/models",
        json={"source": str(directory), **({"name": name} if name else {})},
    )


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


class Stream(threading.Thread):
    """A long streamed chat read to its end on its own thread; `started` is set at the first
    frame."""

    def __init__(self, server, max_tokens=LONG):
        super().__init__(daemon=True)
        self.server, self.max_tokens = server, max_tokens
        self.started = threading.Event()
        self.status = None
        self.text = ""

    def run(self):
        body = {
            "model": SLOW,
            "messages": USER,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{self.server.base_url}/v1/chat/completions", json=body, timeout=GRACEFUL
        ) as response:
            self.status = response.status_code
            for chunk in response.iter_text():
                self.text += chunk
                self.started.set()
        self.started.set()

    def events(self):
        return sse_events(self.text)


class Call(threading.Thread):
    """One HTTP call on its own thread; `response` once it returns."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.response = call, None
        self.start()

    def run(self):
        self.response = self.call()


@pytest.fixture(scope="module")
def dirs(tiny_dirs, tmp_path_factory):
    base = tmp_path_factory.mktemp("fault-models")
    llama = tiny_dirs["llama"]
    no_weights = model_dirs.copy_of(llama, base / "no-weights")
    (no_weights / model_dirs.SAFETENSORS).unlink()
    return {
        "slow": model_dirs.endless(llama, base / SLOW),
        "other": tiny_dirs["gemma2"],
        "third": model_dirs.copy_of(llama, base / "third"),
        "garbage": model_dirs.garbage_config(llama, base / "garbage-config"),
        "truncated": model_dirs.truncated(llama, base / "truncated"),
        "no-weights": no_weights,
        "later-broken": model_dirs.copy_of(llama, base / "later-broken"),
        "mismatch": model_dirs.with_config(llama, base / "mismatch", intermediate_size=96),
        "huge": model_dirs.huge(llama, base / "huge", elements=2**38),
        "wide": model_dirs.wide_llama(base / "wide", tiny_dirs["tokenizer"]),
        "q2": model_dirs.with_config(
            llama,
            base / "q2",
            quantization_config={"quant_method": "gptq", "bits": 2, "group_size": 128},
        ),
        "bnb": model_dirs.with_config(
            llama,
            base / "bnb",
            quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True},
        ),
    }


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    process = ServerProcess(
        tmp_path_factory.mktemp("faults-home"),
        ["--model", str(dirs["slow"])],
        env={"MILLM_MEMORY_LIMIT_BYTES": str(LIMIT), "GRACEFUL_UNLOAD_TIMEOUT": str(GRACEFUL)},
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def stored(server, dirs):
    """What must never be lost: a profile and two registrations besides the start-up model."""
    assert (
        api(
            server,
            "POST",
            "/api/profiles",
            json={"name": "keep-me", "description": "", "steering": []},
        ).status_code
        == 201
    )
    assert register(server, dirs["other"]).status_code == 201
    assert register(server, dirs["third"]).status_code == 201
    return {"profiles": ["keep-me"], "models": [SLOW, OTHER, "third"]}


@pytest.fixture(autouse=True)
def slow_is_loaded_after(server):
    yield
    assert api(server, "POST", f"/api/models/{SLOW}/load").status_code == 200


def nothing_lost(server, stored):
    profiles = [p["name"] for p in api(server, "GET", "/api/profiles").json()["data"]]
    assert all(name in profiles for name in stored["profiles"]), profiles
    models = states(server)
    assert all(name in models for name in stored["models"]), models


def test_unload_lets_running_requests_finish_and_refuses_new_ones(server, stored, tmp_path):
    sae = api(
        server,
        "POST",
        "/api/saes",
        json={"path": str(build_saelens(tmp_path / "sae", layer=1, seed=4))},
    ).json()["id"]
    stream = Stream(server)
    stream.start()
    assert stream.started.wait(60) and stream.status == 200
    # Loading another model unloads SLOW first, which waits for the running stream.
    load = Call(lambda: api(server, "POST", f"/api/models/{OTHER}/load", timeout=GRACEFUL))
    assert wait_for(lambda: states(server)[SLOW] == "unloading")
    assert states(server)[OTHER] == "loading"
    refusals = {
        "same model": chat(server, SLOW),
        "same model, streamed": chat(server, SLOW, stream=True),
        "the model being loaded": chat(server, OTHER),
        "embeddings": post(server, "/v1/embeddings", {"model": SLOW, "input": "The cat"}),
        "a second load": api(server, "POST", "/api/models/third/load"),
        "an unload": api(server, "POST", f"/api/models/{SLOW}/unload"),
        "an SAE attach": api(server, "POST", f"/api/saes/{sae}/attach"),
    }
    assert stream.is_alive(), (
        "the stream ended before the refusals were checked; they prove nothing"
    )
    for what, response in refusals.items():
        body = error(response, 503, "model_busy", "server_error")
        assert "retry" in body["message"], what
    assert "being unloaded" in refusals["same model"].json()["error"]["message"]
    stream.join(GRACEFUL)
    load.join(GRACEFUL)
    events = answer_events(stream.events())
    assert not any("error" in e for e in events[:-1]), events[-3:]
    assert (
        events[-2]["choices"][0]["finish_reason"] == "length"
        and events[-2]["usage"]["completion_tokens"] == LONG
    )
    assert load.response.status_code == 200 and load.response.json()["state"] == "loaded"
    assert states(server)[SLOW] == "ready" and chat(server, OTHER).status_code == 200
    assert (
        api(server, "GET", f"/api/saes/{sae}").json()["attached"] is False
        and api(server, "GET", "/api/models").json()["locked"] is None
    )
    nothing_lost(server, stored)


def test_corrupt_directories_are_refused_at_registration(server, dirs, stored):
    for key, words in [
        ("garbage", "is not valid JSON"),
        ("truncated", "is truncated"),
        ("no-weights", "has no weight files"),
    ]:
        body = error(register(server, dirs[key]), 400, "invalid_model_source")
        assert words in body["message"] and str(dirs[key]) in body["message"], body
    assert not any(name in states(server) for name in ("garbage-config", "truncated", "no-weights"))
    assert states(server)[SLOW] == "loaded"
    nothing_lost(server, stored)


def test_files_broken_after_registration_are_refused_before_the_unload(server, dirs, stored):
    assert register(server, dirs["later-broken"]).status_code == 201
    model_dirs.truncate(dirs["later-broken"])
    body = error(chat(server, "later-broken"), 500, "model_load_failed", "server_error")
    assert "is truncated" in body["message"] and f"{SLOW!r} stays loaded" in body["message"]
    assert error(
        chat(server, "later-broken", stream=True), 500, "model_load_failed", "server_error"
    )
    assert states(server)["later-broken"] == "ready" and states(server)[SLOW] == "loaded"
    assert chat(server, SLOW).status_code == 200
    nothing_lost(server, stored)


def test_a_load_that_fails_after_the_unload(server, dirs, stored):
    # its headers are whole; only loading finds the misfit
    assert register(server, dirs["mismatch"]).status_code == 201
    body = error(chat(server, "mismatch"), 500, "model_load_failed", "server_error")
    assert "could not load model" in body["message"] and "mismatch" in body["message"]
    assert f"{SLOW!r} was unloaded before the failure" in body["message"]
    assert states(server)["mismatch"] == "error" and states(server)[SLOW] == "ready"
    view = api(server, "GET", "/api/models/mismatch").json()
    assert view["state"] == "error" and "could not load model" in view["error"]
    ready = api(server, "GET", "/api/health/ready")
    assert (
        ready.status_code == 503
        and ready.json()["status"] == "error"
        and ready.json()["model"] == "mismatch"
    )
    assert "mismatch" not in [m["id"] for m in api(server, "GET", "/v1/models").json()["data"]]
    # A failed model is not reloaded by every request that names it; the message says how to retry.
    again = error(chat(server, "mismatch"), 503, "model_not_loaded", "server_error")
    assert "/api/models/mismatch/load" in again["message"]
    nothing_lost(server, stored)
    assert chat(server, SLOW).status_code == 200  # the previous model loads again on demand
    retried = api(server, "POST", "/api/models/mismatch/load")  # an explicit load does retry
    error(retried, 500, "model_load_failed", "server_error")


def test_insufficient_memory_is_refused_before_the_unload_with_the_figures(server, dirs, stored):
    slow_bytes = model_dirs.parameters(dirs["slow"]) * 4  # the CPU holds float32 weights
    assert register(server, dirs["huge"]).status_code == 201
    body = error(chat(server, "huge"), 503, "insufficient_memory")
    [figures] = body["devices"]
    assert (
        figures["device"] == "cpu"
        and figures["needed_bytes"] == 2**40
        and figures["limit_bytes"] == LIMIT
    )
    assert figures["reclaimable_bytes"] == slow_bytes and 0 < figures["free_bytes"] < 2**40
    assert "cpu has" in body["message"] and f"{SLOW!r} stays loaded" in body["message"]

    assert register(server, dirs["wide"]).status_code == 201
    body = error(chat(server, "wide", stream=True), 503, "insufficient_memory")
    [figures] = body["devices"]
    assert figures["needed_bytes"] == model_dirs.parameters(dirs["wide"]) * 4 > LIMIT
    # only the cap refuses it
    assert figures["needed_bytes"] < figures["free_bytes"] + figures["reclaimable_bytes"]
    assert "MILLM_MEMORY_LIMIT_BYTES" in body["message"] and "cpu has" not in body["message"]
    error(api(server, "POST", "/api/models/wide/load"), 503, "insufficient_memory")
    assert states(server)[SLOW] == "loaded" and states(server)["wide"] == "ready"
    assert chat(server, SLOW).status_code == 200
    nothing_lost(server, stored)


def test_unsupported_quantization_is_refused_before_the_unload(server, dirs, stored):
    for key, words in [("q2", "gptq 2-bit"), ("bnb", "bitsandbytes 4-bit")]:
        registered = register(server, dirs[key])
        assert registered.status_code == 201 and registered.json()["quantization"] in (
            "gptq",
            "bitsandbytes",
        )
        body = error(chat(server, key), 400, "unsupported_quantization")
        assert words in body["message"] and body["param"] == "model"
    assert (
        "2-bit"
        in error(api(server, "POST", "/api/models/q2/load"), 400, "unsupported_quantization")[
            "message"
        ]
    )
    assert states(server)[SLOW] == "loaded" and chat(server, SLOW).status_code == 200
    nothing_lost(server, stored)


def test_requests_running_past_the_graceful_timeout_end_with_model_busy(dirs, tmp_path):
    server = ServerProcess(
        tmp_path / "home", ["--model", str(dirs["slow"])], env={"GRACEFUL_UNLOAD_TIMEOUT": "0.5"}
    ).wait_ready()
    try:
        stream = Stream(server)
        stream.start()
        assert stream.started.wait(60) and stream.status == 200
        queued = Call(lambda: chat(server, SLOW, max_tokens=LONG, n=4))
        assert wait_for(
            lambda: api(server, "GET", "/api/health/inference").json()["queue_depth"] == 1
        )
        began = time.monotonic()
        unloaded = api(server, "POST", f"/api/models/{SLOW}/unload")
        assert unloaded.status_code == 200 and unloaded.json()["was_loaded"] is True
        assert time.monotonic() - began < 30
        stream.join(60)
        queued.join(60)
        events = stream.events()
        assert events[-1] == "[DONE]"
        assert (
            events[-2]["error"]["code"] == "model_busy"
            and "GRACEFUL_UNLOAD_TIMEOUT" in events[-2]["error"]["message"]
        )
        assert not any(
            e["choices"][0].get("finish_reason") for e in events[:-2] if e.get("choices")
        )
        error(queued.response, 503, "model_busy", "server_error")
        answer = chat(server, SLOW)  # the next request loads the model again
        assert answer.status_code == 200 and json.loads(answer.text)["model"] == SLOW
    finally:
        server.stop()
