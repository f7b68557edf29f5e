"""What a route reaches through its app: its capability's service, and the settings it reports
with. The composition root hands the app its parts; a route asks for the one of the kind it uses,
so no route module imports the shell that built them."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request

from millm.settings import Settings

T = TypeVar("T")


def part(request: Request, kind: type[T]) -> T:
    """The app's one part of this kind (the routes' one way into the service)."""
    found = request.app.state.facades.of(kind)
    assert isinstance(found, kind)  # the composition root made one of each
    return found


def settings_of(request: Request) -> Settings:
    """The server's settings (read-only)."""
    return request.app.state.settings
