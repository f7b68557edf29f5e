"""Calls to an OpenAI-compatible server the operator configured (a judge, an explainer, an
embedder)."""

from __future__ import annotations

import httpx

from millm.errors import GenerationFailed


def post_json(client: httpx.Client, url: str, body: dict, who: str) -> dict:
    """POST `body` to `url` and return the JSON answer; GenerationFailed naming `who` and the URL
    when the server cannot be reached or answers anything but 200."""
    try:
        response = client.post(url, json=body)
    except httpx.HTTPError as exc:
        raise GenerationFailed(f"the {who} at {url} could not be reached: {exc}") from None
    if response.status_code != 200:
        raise GenerationFailed(
            f"the {who} at {url} answered {response.status_code}: {response.text[:300]}"
        )
    return response.json()
