"""Every 503 says when to come back: a safety net under the error handlers.

The API's own 503s carry a Retry-After chosen for their cause (the error table's, or a queue's
estimated wait: v1/http/errors.py). A 503 that reaches a client without one (a framework's own,
a route that answers 503 by hand and forgot) gets RETRY_AFTER_FALLBACK seconds here, and a
warning in the log, so the gap is seen and mended at its source.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from millm.v1.http.errors import RETRY_AFTER_FALLBACK

log = logging.getLogger(__name__)
HEADER = b"retry-after"


class RetryAfterNet:
    """Pure ASGI: adds Retry-After to a 503 response start that lacks it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                headers = list(message.get("headers", []))
                if not any(name.lower() == HEADER for name, _ in headers):
                    log.warning("retry_after_defaulted %s", scope.get("path"))
                    headers.append((HEADER, str(RETRY_AFTER_FALLBACK).encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)
