"""OpenAI SDK and raw HTTP helpers for tests against a live server."""

from __future__ import annotations

import json

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


def api(server, method: str, path: str, timeout: float = 120, **kwargs) -> httpx.Response:
    """Any request to the server's management or OpenAI routes."""
    return httpx.request(method, f"{server.base_url}{path}", timeout=timeout, **kwargs)


def error(
    response: httpx.Response, status: int, code: str | None = None, type_: str | None = None
) -> dict:
    """The error object of a response that must have this status (and code, and type, when given)."""
    assert response.status_code == status, response.text
    body = response.json()["error"]
    if code:
        assert body["code"] == code, body
    if type_:
        assert body["type"] == type_, body
    return body
