"""JSON request bodies read as JSON Schema reads numbers: 2.0 is the integer 2.

JSON has one number type, and the served OpenAPI schema (JSON Schema 2020-12) calls any number
with a zero fractional part an `integer`, so a client that writes `"max_tokens": 2.0` (a
JavaScript client's arithmetic, a Python float) sends what the schema allows. The request models
parse strictly (a bool or a string is never a number), and a strict int refuses a float; so
whole-number literals are decoded as ints here, once, before any model sees them. A float field
accepts an int unchanged in value, so nothing that was accepted before changes meaning.

Every router is an `APIRouter(route_class=JsonRoute)`: FastAPI reads a JSON body through
`Request.json()`, which this route's request overrides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


def json_number(literal: str) -> int | float:
    """A JSON number literal with a fraction or exponent: an int when it is whole, else a float."""
    value = float(literal)
    return int(value) if value.is_integer() else value


def read_json(raw: bytes) -> Any:
    """A request body decoded with whole numbers as ints (json.loads otherwise)."""
    return json.loads(raw, parse_float=json_number)


class JsonRequest(Request):
    """A request whose JSON body decodes whole numbers as ints."""

    async def json(self) -> Any:
        """The body, decoded once."""
        if not hasattr(self, "_json"):
            self._json = read_json(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route that hands its handler a JsonRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given a JsonRequest over the same connection."""
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return route
