"""What a route reaches through its app: the service objects, and the settings it reports with."""

from __future__ import annotations

from fastapi import Request

from millm.service.composition import ServerState
from millm.service.responses.api import ResponsesApi
from millm.service.serving.serving import Serving
from millm.settings import Settings


def state_of(request: Request) -> ServerState:
    """The server state behind this app (routes hand it to service functions; they never read its fields)."""
    return request.app.state.millm


def serving(request: Request) -> Serving:
    """The generation service behind this app."""
    return request.app.state.serving


def settings_of(request: Request) -> Settings:
    """The server's settings (read-only)."""
    return request.app.state.settings


def responses_api(request: Request) -> ResponsesApi:
    """The Responses API service over this app's chat serving and store (a light view, made per request)."""
    return ResponsesApi(serving(request), state_of(request).store)
