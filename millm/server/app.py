"""The FastAPI application: routes, error handlers and the server state's lifetime."""

from __future__ import annotations

from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import FastAPI
from starlette.datastructures import Headers

from millm import __version__
from millm.kernel.model.leases import HEADER as LEASE_HEADER
from millm.kernel.model.leases import presented
from millm.kernel.model.switch import ModelSwitch
from millm.lab.attribution import routes as attribution
from millm.lab.autosteer import routes as autosteer
from millm.lab.calibration import routes as calibration
from millm.lab.compare import routes as compare
from millm.lab.dictionaries import routes as dictionaries
from millm.lab.discovery import routes as discovery
from millm.lab.documents import routes as documents
from millm.lab.ember import routes as ember
from millm.lab.evaluations import routes as evaluations
from millm.lab.labels import routes as labels
from millm.lab.models import routes as model_admin
from millm.lab.monitoring import routes as monitoring
from millm.lab.probes import routes as probes
from millm.lab.sensing import routes as sensing
from millm.lab.steering import routes as manage
from millm.lab.variants import routes as variants
from millm.lab.vectors import routes as vectors
from millm.server import health, jobs, workbench
from millm.server.access import AccessGuard, Keys
from millm.server.body_limit import BodyLimit
from millm.server.facades import Facades
from millm.server.mcp_server import build_mcp
from millm.server.openapi import install_openapi
from millm.server.retry_after import RetryAfterNet
from millm.settings import Settings
from millm.v1.batches import routes as batches
from millm.v1.files import routes as files
from millm.v1.http.errors import install_error_handlers
from millm.v1.models import routes as models
from millm.v1.responses import routes as responses_api
from millm.v1.serving import routes as completions
from millm.v1.tokenizer import routes as tokenizer

SUMMARY = "OpenAI-compatible inference server with SAE feature steering."


class RequestScope:
    """Opens the switch's request scope around every HTTP request (pure ASGI, so a streamed
    response is still inside it until its last byte): the model a request leased is returned
    only when the exchange has really ended, which is what an unload waits for. The client's
    model lease id (X-miLLM-Lease), if it sent one, is the request's to present."""

    def __init__(self, app, requests: ModelSwitch):
        self.app, self.requests = app, requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = Headers(scope=scope).get(LEASE_HEADER)
        presented.set(token.strip() if token else None)
        with self.requests.request_scope():
            await self.app(scope, receive, send)


def create_app(service: Facades, load_model: bool = True) -> FastAPI:
    """An app serving the service's facades; with load_model the model loads in the background at
    start-up."""
    settings = service.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if load_model:
            service.models.load_at_start()
        service.batches.runner.start()  # batches left running by the last start resume
        await to_thread.run_sync(service.dictionaries.resume_interrupted)  # trainings, likewise
        # several circuits active while CIRCUIT_ALLOW_CONCURRENT is now off: only the last stays
        await to_thread.run_sync(service.circuit_serving.demote_past_the_flag)
        try:
            async with mcp.sessions.run():  # /mcp serves calls inside the manager's task group
                yield
        finally:
            await service.batches.runner.stop()
        service.dictionaries.stop()
        service.close()

    app = FastAPI(
        title="millm",
        version=__version__,
        summary=SUMMARY,
        lifespan=lifespan,
    )
    app.state.facades = service
    app.state.settings = settings
    install_error_handlers(app)
    # The last added runs first: keys and origins, then the body cap, then the request scope;
    # the Retry-After net sits outermost, so it sees every 503, the middlewares' own included.
    app.add_middleware(RequestScope, requests=service.requests)
    app.add_middleware(
        BodyLimit,
        request_cap=settings.max_request_bytes,
        import_cap=settings.max_import_bytes,
        upload_cap=settings.batch_max_file_bytes,
    )
    app.add_middleware(AccessGuard, keys=Keys.of(settings.api_key, settings.admin_key))
    app.add_middleware(RetryAfterNet)
    include_routes(app, settings)
    # Not in include_routes: the MCP endpoint serves these facades and is no part of the OpenAPI
    # document.
    mcp = build_mcp(service, app)
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
    app.include_router(tokenizer.router, tags=["Tokenizer"])
    app.include_router(files.router, tags=["Batch"])
    app.include_router(batches.router, tags=["Batch"])
    # before manage's /api/saes/{sae_id}, which would take /api/saes/trainings for an SAE id
    app.include_router(dictionaries.router, tags=["Dictionaries"])
    app.include_router(manage.router, tags=["Management"])
    app.include_router(labels.router, tags=["Feature labels"])
    app.include_router(model_admin.router, tags=["Models"])
    app.include_router(documents.router, tags=["Clusters and circuits"])
    app.include_router(monitoring.router, tags=["Monitoring"])
    app.include_router(sensing.router, tags=["Sensing"])
    app.include_router(compare.router, tags=["Discovery"])
    app.include_router(jobs.router, tags=["Jobs"])
    app.include_router(discovery.router, tags=["Discovery"])
    app.include_router(attribution.router, tags=["Discovery"])
    app.include_router(calibration.router, tags=["Discovery"])
    app.include_router(autosteer.router, tags=["Discovery"])
    app.include_router(vectors.router, tags=["Steering vectors"])
    app.include_router(variants.router, tags=["Steered variants"])
    app.include_router(evaluations.router, tags=["Evaluations"])
    app.include_router(probes.router, tags=["Probes"])
    app.include_router(ember.router, tags=["Ember (goodfire SDK)"])
    app.include_router(health.router, tags=["Health"])
    app.include_router(workbench.router)
    workbench.mount_assets(app)
