"""A served request as an HTTP response: the X-miLLM-* headers of its report, a JSON body or an
SSE stream, and the client's departure turned into cancelling the work."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import suppress
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from millm.errors import ClientGone, MillmError
from millm.formats.mistudio import RUNG_LANGUAGE
from millm.interp.intensity import echo
from millm.kernel.steering.plan import Plan
from millm.kernel.steering.statement import statement
from millm.v1.http.errors import error_body
from millm.v1.http.headers import item, members, seed_header, string_list, token
from millm.v1.objects import WireModel
from millm.v1.serving.replies import Reply, Report

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
T = TypeVar("T")


def steering_header(plan: Plan, changed: bool = False) -> str:
    """X-miLLM-Steering: what steered a request, in the original miLLM's grammar
    (kernel/steering/statement.py)."""
    return members(statement(plan, changed), encoded=frozenset({"name"}))


def report_headers(report: Report, ignored_cap: int) -> dict[str, str]:
    """X-miLLM-Ignored-Fields, -Constrained, -Seed, -Steering (except on a stream that ends with
    it in a chunk), -Steering-Intensity and -Circuit-Rung, each an RFC 8941 item or list."""
    headers = {}
    ignored = string_list(list(report.ignored), ignored_cap)
    if ignored:
        headers["X-miLLM-Ignored-Fields"] = ignored
    if report.structured is not None:
        structured = report.structured
        headers["X-miLLM-Constrained"] = (
            token("json_object")
            if structured.mode == "json_object"
            else token("json_schema", name=structured.name)
        )
    if report.seed is not None:
        headers["X-miLLM-Seed"] = seed_header(report.seed, report.seed_scope)
    plan = report.plan
    if not report.in_stream:
        headers["X-miLLM-Steering"] = steering_header(plan, report.changed)
    if plan.intensity is not None:
        headers["X-miLLM-Steering-Intensity"] = echo(plan.intensity)
    if plan.rung is not None:
        headers["X-miLLM-Circuit-Rung"] = item(plan.rung, language=RUNG_LANGUAGE[plan.rung])
    return headers


def sse(payload: dict | str) -> str:
    """One server-sent event frame."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def frames(
    chunks: AsyncIterator[WireModel | MillmError], done: bool = True
) -> AsyncIterator[str]:
    """Each chunk as an SSE frame (an error as OpenAI's error object), then [DONE] (unless
    `done` is False: the stream's end then says it)."""
    try:
        async for chunk in chunks:
            yield sse(
                error_body(chunk, streamed=True)
                if isinstance(chunk, MillmError)
                else chunk.model_dump()
            )
        if done:
            yield sse("[DONE]")
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]  # an async generator: closing it cancels the job


async def event_frames(events: AsyncIterator[WireModel]) -> AsyncIterator[str]:
    """Typed events as the Responses API frames them: `event:` names each, and no [DONE] ends
    them."""
    try:
        async for event in events:
            payload = event.model_dump()
            yield f"event: {payload['type']}\n{sse(payload)}"
    finally:
        await events.aclose()  # type: ignore[attr-defined]  # an async generator: closing it cancels the job


def respond(reply: Reply, ignored_cap: int, framing=frames) -> JSONResponse | StreamingResponse:
    """The HTTP response of a served request; a stream is framed by `framing`."""
    headers = report_headers(reply.report, ignored_cap)
    if reply.chunks is not None:
        return StreamingResponse(
            framing(reply.chunks),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **headers},
        )
    assert reply.body is not None
    return JSONResponse(reply.body.model_dump(), headers=headers)


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; if the client disconnects first, the work is cancelled (and with it its
    job)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        raise ClientGone("the client disconnected before the answer was ready")
    return task.result()


async def disconnected(request: Request) -> None:
    """Returns once the client has gone away (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
