"""GET /api/health (liveness) and /api/health/ready (503 until a model is loaded)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from millm.service.state import ModelStatus, ServerState

router = APIRouter()


@router.get("/api/health", summary="Liveness")
async def health():
    """The process is up and answering."""
    return {"status": "ok"}


@router.get("/api/health/ready", summary="Readiness: 200 once a model is loaded, else 503")
async def ready(request: Request):
    """Whether requests can be served now, with the model's state (and load error, if any)."""
    state: ServerState = request.app.state.millm
    body = {"status": "ready" if state.status is ModelStatus.LOADED else state.status.value, "model": state.expected_name}
    if state.lm is not None:
        body["system_fingerprint"] = state.lm.system_fingerprint
    if state.load_error:
        body["error"] = state.load_error
    return JSONResponse(body, status_code=200 if state.status is ModelStatus.LOADED else 503)


@router.get("/api/health/inference", summary="Scheduler state: backend, queue depth, batch size, requests per backend")
async def inference(request: Request):
    """Which backend serves generation, what waits and runs now, and jobs served / cancelled / failed per backend."""
    state: ServerState = request.app.state.millm
    scheduler = state.scheduler
    enabled = state.settings.enable_continuous_batching
    body = {
        "backend": None,
        "continuous_batching": {"enabled": enabled, "max_batch_size": state.settings.max_batch_size, "unavailable": None},
        "queue_depth": 0,
        "running_rows": 0,
        "batch_size": 0,
        "jobs": {},
    }
    if scheduler is None:
        return body
    body["continuous_batching"]["unavailable"] = scheduler.batching_unavailable
    body.update(
        backend=scheduler.backend,
        queue_depth=scheduler.queue_depth,
        running_rows=scheduler.running_rows,
        batch_size=scheduler.batch_rows,
        jobs={backend: dict(counts) for backend, counts in scheduler.stats.items()},
    )
    return body
