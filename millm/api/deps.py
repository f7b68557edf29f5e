"""What a route reaches through its app: the service's facades, and the settings it reports with."""

from __future__ import annotations

from fastapi import Request

from millm.service.facades import Facades
from millm.settings import Settings


def facades(request: Request) -> Facades:
    """The service's facades behind this app (the routes' one way in)."""
    return request.app.state.facades


def settings_of(request: Request) -> Settings:
    """The server's settings (read-only)."""
    return request.app.state.settings
