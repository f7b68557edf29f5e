"""A live feed as a server-sent-events response: each record one `data:` frame (JSON), comments
as keep-alives, until the client goes away."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import StreamingResponse

from millm.kernel.runtime.feed import LiveFeed

KEEPALIVE_SECONDS = 15.0


def feed_response(request: Request, feed: LiveFeed, hello: str) -> StreamingResponse:
    """The feed for one client, opened with the comment `hello`."""
    subscriber = feed.subscribe()

    async def frames():
        try:
            yield f": {hello}\n\n"
            while True:
                try:
                    record = await asyncio.wait_for(subscriber.queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    if await request.is_disconnected():
                        return
                    yield ": keep-alive\n\n"
                    continue
                yield f"data: {json.dumps(record)}\n\n"
        finally:
            feed.unsubscribe(subscriber)

    return StreamingResponse(
        frames(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
