"""OpenAI SDK and raw HTTP helpers for tests against a live server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from openai import OpenAI

MODEL = "tiny-llama"


def sdk(server) -> OpenAI:
    """The official SDK pointed at the server; no retries, so a 503 is seen as it is."""
    return OpenAI(
        base_url=f"{server.base_url}/v1", api_key="not-needed", max_retries=0, timeout=120
    )


def post(server, path: str, body: dict, **kwargs) -> httpx.Response:
    """A raw POST, for status codes, headers and bodies the SDK would hide."""
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120, **kwargs)


def sse_events(response_text: str) -> list:
    """Parse an SSE body into JSON payloads (and the literal '[DONE]')."""
    events = []
    for frame in response_text.split("\n\n"):
        if not frame.strip():
            continue
        assert frame.startswith("data: "), frame
        data = frame[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def answer_events(events: list) -> list:
    """A completed chat or text completion stream without its last chunk, which says what
    steered it (`millm_steering`, no choices, created 0), checked to be there once."""
    assert events[-1] == "[DONE]" and "millm_steering" in events[-2], events[-2:]
    assert events[-2]["choices"] == [] and events[-2]["created"] == 0
    assert sum(isinstance(e, dict) and "millm_steering" in e for e in events) == 1
    return [*events[:-2], "[DONE]"]


def api(server, method: str, path: str, timeout: float = 120, **kwargs) -> httpx.Response:
    """Any request to the server's management or OpenAI routes."""
    return httpx.request(method, f"{server.base_url}{path}", timeout=timeout, **kwargs)


def error(
    response: httpx.Response, status: int, code: str | None = None, type_: str | None = None
) -> dict:
    """The error object of a response that must have this status (and code, and type, when
    given)."""
    assert response.status_code == status, response.text
    body = response.json()["error"]
    if code:
        assert body["code"] == code, body
    if type_:
        assert body["type"] == type_, body
    return body


def attach_sae(server, path) -> str:
    """Register the SAE folder at `path` and attach it; its id."""
    sae = post(server, "/api/saes", {"path": str(path)}).json()["id"]
    attached = post(server, f"/api/saes/{sae}/attach", {})
    assert attached.status_code == 200, attached.text
    return sae


def finished_job(server, job_id: str, timeout: float = 240) -> dict:
    """The job's view once it is no longer running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api(server, "GET", f"/api/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end")


@contextmanager
def llama_with_sae(tiny_dirs, folder: Path, seed: int, env: dict | None = None) -> Iterator:
    """A live server on the tiny Llama with a SAELens SAE on block 1 attached (`.sae`,
    `.sae_dir`)."""
    from tests.support.server import ServerProcess
    from tests.support.tiny_saes import build_saelens

    sae_dir = build_saelens(folder / "sae", layer=1, seed=seed)
    (folder / "home").mkdir(parents=True, exist_ok=True)
    process = ServerProcess(folder / "home", ["--model", str(tiny_dirs["llama"])], env=env)
    try:
        process.wait_ready()
        process.sae, process.sae_dir = attach_sae(process, sae_dir), sae_dir
        yield process
    finally:
        process.stop()
