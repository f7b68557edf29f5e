"""A batch's input lines checked, each to a request its endpoint's body model accepts or to its
error line; the first failing check of a line says what is wrong, and names the line (1-based).

`{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body": {...}}`: a body is checked
as the synchronous route checks it, with X-miLLM-Strict on (a field the route would ignore is a
refusal, since nobody reads a batch's headers), and a streamed body is refused (a batch answers
whole). Routes beyond /v1 whose lines a batch runs (POST /api/probes/score) are LineServers the
composition root hands in: their bodies name no model, and run on the resident one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from millm.errors import MillmError
from millm.v1.http.errors import validation_error
from millm.v1.objects import hex_id
from millm.v1.policy.field_policy import unused_locations
from millm.v1.serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

Body = ChatCompletionRequest | CompletionRequest | EmbeddingRequest
ENDPOINTS: dict[str, type[Body]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
}


class LineServer(Protocol):
    """A route beyond /v1 whose lines a batch runs: how it parses a line's body (a
    ValidationError or a MillmError refuses the line) and answers a parsed one."""

    def parse(self, body: dict) -> BaseModel:
        """The body as the route's request model."""
        ...

    async def answer(self, body: BaseModel) -> BaseModel:
        """The route's answer to one parsed body."""
        ...


MAX_LINE_BYTES = 1024 * 1024
MAX_CUSTOM_ID = 512


def line_id() -> str:
    """An output or error line's id: `batch_req_` and 24 hex digits."""
    return hex_id("batch_req_")


def request_id() -> str:
    """A served line's request id: `req_` and 24 hex digits."""
    return hex_id("req_")


@dataclass(frozen=True)
class Line:
    """A line that passed every check: its number, custom_id and its body, parsed once."""

    number: int
    custom_id: str
    body: BaseModel  # a Body, or a LineServer's request

    @property
    def model(self) -> str | None:
        """The model the line names (None: a LineServer's line, run on the resident model)."""
        return getattr(self.body, "model", None)


def error_line(number: int, custom_id: str | None, code: str, message: str) -> dict:
    """An error file's line for a line that never ran."""
    return {
        "id": line_id(),
        "custom_id": custom_id,
        "line": number,
        "response": None,
        "error": {"code": code, "message": f"Line {number}: {message}"},
    }


def split(data: bytes) -> list[bytes]:
    """A file's lines (a last line without a newline is a line; a file's last newline ends one)."""
    lines = data.split(b"\n")
    return lines[:-1] if lines and lines[-1] == b"" else lines


def read_lines(
    data: bytes, endpoint: str, servers: Mapping[str, LineServer] | None = None
) -> tuple[list[Line], list[dict]]:
    """The valid lines and the error lines of an input file, in line order."""
    valid: list[Line] = []
    errors: list[dict] = []
    seen: set[str] = set()
    server = (servers or {}).get(endpoint)
    for number, raw in enumerate(split(data), start=1):
        checked = check_line(number, raw, endpoint, seen, server)
        (valid if isinstance(checked, Line) else errors).append(checked)  # type: ignore[arg-type]  # one of the two kinds, by its own type
    return valid, errors


def check_line(
    number: int, raw: bytes, endpoint: str, seen: set[str], server: LineServer | None = None
) -> Line | dict:
    """One line as a Line, or its error line (`server`: the route beyond /v1 it is for)."""
    if len(raw) > MAX_LINE_BYTES:
        return error_line(number, None, "line_too_large", f"over {MAX_LINE_BYTES} bytes")
    try:
        entry = json.loads(raw)
    except ValueError as exc:
        return error_line(number, None, "invalid_json", f"not JSON ({exc})")
    if not isinstance(entry, dict):
        return error_line(number, None, "invalid_line", "a line is a JSON object")
    custom_id = entry.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return error_line(
            number,
            None,
            "invalid_custom_id",
            f"custom_id is a string of 1-{MAX_CUSTOM_ID} characters",
        )
    if entry.get("method") != "POST":
        return error_line(number, custom_id, "invalid_method", 'method must be "POST"')
    if entry.get("url") != endpoint:
        return error_line(number, custom_id, "invalid_url", f"url must be the batch's {endpoint}")
    body = entry.get("body")
    if not isinstance(body, dict):
        return error_line(number, custom_id, "invalid_body", "body is a JSON object")
    if custom_id in seen:
        return error_line(
            number,
            custom_id,
            "duplicate_custom_id",
            f"custom_id {custom_id!r} is on an earlier line",
        )
    seen.add(custom_id)
    if body.get("stream") is True:
        return error_line(
            number,
            custom_id,
            "stream_not_supported",
            "a batch answers whole: body.stream is refused",
        )
    try:
        parsed = (
            server.parse(body) if server is not None else ENDPOINTS[endpoint].model_validate(body)
        )
    except ValidationError as exc:
        refused = validation_error(RequestValidationError(exc.errors(), body=body))
        return error_line(number, custom_id, "invalid_request", f"body.{refused.message}")
    except MillmError as exc:
        return error_line(number, custom_id, exc.code, f"body: {exc.message}")
    unused = unused_locations(parsed) if server is None else []  # its model forbids extras
    if unused:
        return error_line(
            number,
            custom_id,
            "unused_fields_refused",
            f"body would have these fields ignored: {', '.join(unused)}",
        )
    return Line(number, custom_id, parsed)
