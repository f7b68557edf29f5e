"""POST /api/compare: one conversation generated under several steering variants, side by side."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from millm.lab.compare.protocol import CompareRequest, Comparison
from millm.lab.compare.service import Comparer
from millm.v1.http.deps import part, settings_of
from millm.v1.http.headers import STRICT_HEADER, strict_mode
from millm.v1.http.json_body import JsonRoute
from millm.v1.serving.http_replies import respond, unless_client_leaves

router = APIRouter(route_class=JsonRoute)
STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The comparison; with stream: true, server-sent events (compare.start, "
        "compare.delta, compare.finish, compare.usage, then [DONE])",
        "content": {"text/event-stream": {}},
    }
}


@router.post(
    "/api/compare",
    summary="One conversation under several steering variants, generated together",
    response_model=Comparison,
    responses=STREAM_RESPONSE,
)
async def compare_variants(body: CompareRequest, request: Request):
    """Generate the conversation unsteered, live, under a profile, features, a cluster or a
    circuit, side by side."""
    reply = await unless_client_leaves(
        request,
        part(request, Comparer).compare(body, strict_mode(request.headers.get(STRICT_HEADER))),
    )
    return respond(reply, settings_of(request).ignored_fields_header_max_bytes)
