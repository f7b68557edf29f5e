"""The FastAPI application: routes, error handlers and the server state's lifetime."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from millm import __version__
from millm.api import (
    autosteer,
    calibration,
    compare,
    completions,
    discovery,
    documents,
    health,
    jobs,
    labels,
    manage,
    model_admin,
    models,
    monitoring,
    probes,
    responses_api,
    vectors,
    workbench,
)
from millm.api.access import AccessGuard, Keys
from millm.api.body_limit import BodyLimit
from millm.api.errors import install_error_handlers
from millm.api.mcp_server import build_mcp
from millm.api.openapi import install_openapi
from millm.service.composition import ServerState
from millm.service.serving.serving import Serving
from millm.settings import Settings

SUMMARY = "OpenAI-compatible inference server with SAE feature steering."


class RequestScope:
    """Opens the state's request scope around every HTTP request (pure ASGI, so a streamed
    response is still inside it until its last byte): the model a request leased is returned
    only when the exchange has really ended, which is what an unload waits for."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.state.switch.request_scope():
            await self.app(scope, receive, send)


def create_app(state: ServerState, load_model: bool = True) -> FastAPI:
    """An app serving `state`; with load_model the model loads in the background at start-up."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if load_model:
            state.switch.load_in_background()
        async with mcp.sessions.run():  # /mcp serves calls inside the manager's task group
            yield
        state.close()

    app = FastAPI(
        title="millm",
        version=__version__,
        summary=SUMMARY,
        lifespan=lifespan,
    )
    app.state.millm = state
    app.state.settings = state.settings
    app.state.serving = Serving(state)
    install_error_handlers(app)
    # The last added runs first: keys and origins, then the body cap, then the request scope.
    app.add_middleware(RequestScope, state=state)
    app.add_middleware(BodyLimit, request_cap=state.settings.max_request_bytes, import_cap=state.settings.max_import_bytes)
    app.add_middleware(AccessGuard, keys=Keys.of(state.settings.api_key, state.settings.admin_key))
    include_routes(app, state.settings)
    # Not in include_routes: the MCP endpoint serves this state and is no part of the OpenAPI document.
    mcp = build_mcp(state, app)
    app.router.routes.append(mcp.route)
    return app


def served_openapi(settings: Settings) -> dict:
    """The OpenAPI schema a server with these settings serves, without starting one."""
    app = FastAPI(title="millm", version=__version__, summary=SUMMARY)
    include_routes(app, settings)
    return app.openapi()


def include_routes(app: FastAPI, settings: Settings) -> None:
    """Every router, and the OpenAPI schema that describes them."""
    install_openapi(app, settings)
    app.include_router(completions.router, tags=["OpenAI"])
    app.include_router(responses_api.router, tags=["OpenAI"])
    app.include_router(models.router, tags=["OpenAI"])
    app.include_router(manage.router, tags=["Management"])
    app.include_router(labels.router, tags=["Feature labels"])
    app.include_router(model_admin.router, tags=["Models"])
    app.include_router(documents.router, tags=["Clusters and circuits"])
    app.include_router(monitoring.router, tags=["Monitoring"])
    app.include_router(compare.router, tags=["Discovery"])
    app.include_router(jobs.router, tags=["Jobs"])
    app.include_router(discovery.router, tags=["Discovery"])
    app.include_router(calibration.router, tags=["Discovery"])
    app.include_router(autosteer.router, tags=["Discovery"])
    app.include_router(vectors.router, tags=["Steering vectors"])
    app.include_router(probes.router, tags=["Probes"])
    app.include_router(health.router, tags=["Health"])
    app.include_router(workbench.router)
    workbench.mount_assets(app)
