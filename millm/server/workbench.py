"""The workbench page (/ui) and the landing page (/): static files, served with a strict CSP.

The page is a client of the documented API and nothing else: these routes only hand out files.
They are open (no key), like the OpenAPI schema; the page asks for a key when the API needs one.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from html import escape
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from millm import __version__
from millm.v1.http.json_body import JsonRoute

ROOT = Path(__file__).resolve().parent.parent / "workbench"
ASSETS = ROOT / "assets"
IMPORT_MAP = re.compile(r'<script type="importmap">(.*?)</script>', re.S)

router = APIRouter(include_in_schema=False, route_class=JsonRoute)


@cache
def page() -> tuple[str, str]:
    """index.html and its Content-Security-Policy (scripts from this server, plus the page's
    import map by hash)."""
    html = (ROOT / "index.html").read_text(encoding="utf-8")
    found = IMPORT_MAP.search(html)
    hashes = ""
    if found:
        digest = base64.b64encode(hashlib.sha256(found.group(1).encode("utf-8")).digest()).decode(
            "ascii"
        )
        hashes = f" 'sha256-{digest}'"
    policy = (
        "default-src 'self'; "
        f"script-src 'self'{hashes}; "
        "style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
    )
    return html, policy


@router.api_route("/ui", methods=["GET", "HEAD"])
@router.api_route("/ui/", methods=["GET", "HEAD"])
async def workbench():
    """The workbench page."""
    html, policy = page()
    return HTMLResponse(
        html,
        headers={
            "Content-Security-Policy": policy,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


@router.api_route("/", methods=["GET", "HEAD"])
async def landing():
    """A short page naming what this server offers, linking to the workbench."""
    return HTMLResponse(
        "<!doctype html><meta charset=utf-8><title>millm</title>"
        f"<h1>millm {escape(__version__)}</h1>"
        "<ul>"
        '<li><a href="/ui">Workbench</a>: find, steer, compare and watch features</li>'
        "<li><code>/v1</code>: the OpenAI-compatible API (point a client's <code>base_url</code> "
        "here)</li>"
        '<li><a href="/docs">API reference</a> (<a href="/openapi.json">openapi.json</a>)</li>'
        '<li><a href="/api/health/ready">Readiness</a></li>'
        "</ul>",
        headers={
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
            "Cache-Control": "no-cache",
        },
    )


def mount_assets(app) -> None:
    """The page's scripts, styles and vendored libraries under /ui/assets."""
    app.mount(
        "/ui/assets", StaticFiles(directory=ASSETS, follow_symlink=False), name="workbench-assets"
    )
