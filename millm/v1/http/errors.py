"""Every failure as OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, compile_path

from millm.errors import InvalidRequest, MillmError, describe

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
LOWER = {method.lower() for method in METHODS}
log = logging.getLogger(__name__)

# 400 from the framework itself: a body it could not read as text (FastAPI: "There was an error
# parsing the body").
HTTP_CODES = {
    400: "invalid_parameter",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
}
HTTP_MESSAGES = {
    "There was an error parsing the body": "the request body could not be read as JSON (is it "
    "UTF-8?)"
}


# What a 503 that names no wait of its own says (the safety net in server/retry_after.py too).
RETRY_AFTER_FALLBACK = 10


def retry_after(error: MillmError) -> int | None:
    """Whole seconds to wait before trying again: every 503 has them, nothing else does."""
    if error.status != 503:
        return None
    return max(1, error.retry_after or RETRY_AFTER_FALLBACK)


def error_body(error: MillmError, streamed: bool = False) -> dict:
    """The JSON body for an error; in a stream (whose status was sent long before) a 503's wait
    is said in the error object, as `retry_after`, since no header can carry it any more."""
    body = error.to_dict()
    wait = retry_after(error) if streamed else None
    return {"error": body if wait is None else {**body, "retry_after": wait}}


def error_response(error: MillmError) -> JSONResponse:
    """A JSONResponse with the error's status and OpenAI-shaped body (and a 503's Retry-After)."""
    wait = retry_after(error)
    headers = {"Retry-After": str(wait)} if wait is not None else None
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


PRIMITIVE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_union_label(part: str) -> bool:
    # Pydantic names the union branch it tried ('str', 'list[str]', 'constrained-int',
    # 'function-after[...]'); OpenAI field names never look like that.
    return part in PRIMITIVE_LABELS or "[" in part or "(" in part or "-" in part


def field_path(loc: tuple, body: Any = None) -> str | None:
    """Pydantic's location ('body', 'messages', 2, 'name') as 'messages[2].name'. With the body,
    a discriminated union's tag ('candidates', 0, 'feature', 'strengths') is left out too: it is
    a key the body's object does not have, before the end of the location."""
    path, node = "", body
    for i, part in enumerate(loc):
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
        elif _is_union_label(part) or (
            isinstance(node, dict) and part not in node and i < len(loc) - 1
        ):
            continue
        else:
            path += f".{part}" if path else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return path or None


def validation_error(exc: RequestValidationError) -> InvalidRequest:
    """The first validation problem as a 400 naming the field."""
    errors = exc.errors()
    first: dict[str, Any] = (
        errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    )
    if first.get("type") == "json_invalid":
        return InvalidRequest(
            f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(
                ": "
            )
        )
    param = field_path(tuple(first.get("loc", ())), exc.body)
    message = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        message = f"{param} is required" if param else "a required field is missing"
    elif param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return InvalidRequest(message, param=param)


def allowed_methods(request: Request) -> list[str]:
    """The methods the resource at this path takes, for a 405's Allow (Starlette names only the
    first route's, and FastAPI nests included routers where a walk over `app.routes` misses them).

    The resource is the served schema's: of the documented paths the request's path matches, the
    most specific (fewest parameters), so `/api/profiles/deactivate` is its POST alone and not
    also `/api/profiles/{key}`'s GET, PUT and DELETE. A path the schema does not document (the
    MCP endpoint, the workbench's files) is asked of the routes themselves."""
    path = request.scope["path"]
    documented = [
        (template.count("{"), set(operations) & LOWER)
        for template, operations in request.app.openapi().get("paths", {}).items()
        if compile_path(template)[0].match(path)
    ]
    if documented:
        fewest = min(count for count, _ in documented)
        methods = {m.upper() for count, ops in documented if count == fewest for m in ops}
        methods |= {"HEAD"} if "GET" in methods else set()
        return [method for method in METHODS if method in methods]
    return [
        method
        for method in METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    ]


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure, including FastAPI's own, to the OpenAI error shape."""

    @app.exception_handler(MillmError)
    async def _millm(_: Request, exc: MillmError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        carried = getattr(exc, "error", None)  # body_limit.BodyOverCap carries the API's own error
        if isinstance(carried, MillmError):
            return error_response(carried)
        detail = str(exc.detail)
        error = MillmError(
            HTTP_MESSAGES.get(detail, detail), code=HTTP_CODES.get(exc.status_code, "http_error")
        )
        error.status = exc.status_code
        error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        response = error_response(error)
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unexpected error")
        return error_response(MillmError(f"internal error: {describe(exc)}"))
