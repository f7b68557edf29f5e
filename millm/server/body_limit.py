"""Request bodies are capped before they are read: MAX_REQUEST_BYTES, and MAX_IMPORT_BYTES for
imports.

A declared Content-Length over the cap is refused before the application runs; a chunked body
is counted as it arrives and refused the moment it passes the cap, so no oversized body is ever
buffered whole. Starlette's own RequestBodyLimitMiddleware answers some cases in plain text and
takes one cap per route at import time; this one answers in the API's error shape with caps
from the settings.
"""

from __future__ import annotations

import re

from starlette.exceptions import HTTPException as StarletteHTTPException

from millm.errors import BatchFileLimit, DocumentTooLarge, MillmError, RequestTooLarge
from millm.v1.http.errors import error_response

IMPORT_PATHS = frozenset(
    {
        "/api/profiles/import",
        "/api/clusters/import",
        "/api/circuits/import",
        "/api/vectors/import",
        "/api/probes/import",
    }
)
IMPORT_PATTERNS = (
    re.compile(r"^/api/saes/[^/]+/labels/?$"),
)  # PUT and PATCH of an SAE's feature labels


class BodyOverCap(StarletteHTTPException):
    """Raised from `receive` while the body is being read; FastAPI passes HTTP exceptions through,
    and the error handler answers with the `error` it carries."""

    def __init__(self, error: MillmError):
        super().__init__(status_code=413, detail=error.message)
        self.error = error


UPLOAD_PATH = "/v1/files"
MULTIPART_ALLOWANCE = 65_536  # an upload's multipart framing beside the file itself


def body_cap(
    path: str, request_cap: int, import_cap: int, upload_cap: int = 0
) -> tuple[int, type[MillmError], str]:
    """The cap on this path's body, the error past it, and the setting that sets it (a batch
    file's is the file cap and its framing: past it, 400 batch_file_limit, as for a file the
    upload counts)."""
    if path == UPLOAD_PATH and upload_cap:
        return upload_cap + MULTIPART_ALLOWANCE, BatchFileLimit, "MILLM_BATCH_MAX_FILE_BYTES"
    if path in IMPORT_PATHS or any(pattern.match(path) for pattern in IMPORT_PATTERNS):
        return import_cap, DocumentTooLarge, "MAX_IMPORT_BYTES"
    return request_cap, RequestTooLarge, "MAX_REQUEST_BYTES"


def _declared_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses a malformed length itself
    return None


class BodyLimit:
    """Pure ASGI middleware enforcing `body_cap` on every HTTP request."""

    def __init__(self, app, request_cap: int, import_cap: int, upload_cap: int = 0):
        self.app, self.request_cap, self.import_cap = app, request_cap, import_cap
        self.upload_cap = upload_cap

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap, error, setting = body_cap(
            scope["path"], self.request_cap, self.import_cap, self.upload_cap
        )

        def refusal(size: str) -> MillmError:
            return error(
                f"the request body is {size}; this route takes at most {cap} bytes ({setting})"
            )

        declared = _declared_length(scope)
        if declared is not None and declared > cap:
            await error_response(refusal(f"{declared} bytes"))(scope, receive, send)
            return
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise BodyOverCap(refusal(f"over {cap} bytes"))
            return message

        await self.app(scope, counted, send)
