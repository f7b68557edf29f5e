"""GET /api/health (liveness), /api/health/ready (503 until a model is loaded),
/api/health/inference."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from millm.lab.models.service import ModelManagement
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.get("/api/health", summary="Liveness")
async def health():
    """The process is up and answering."""
    return {"status": "ok"}


@router.get("/api/health/ready", summary="Readiness: 200 once a model is loaded, else 503")
def ready(request: Request):
    """Whether requests can be served now, with the model's state (and load error, if any)."""
    body, ready_now = part(request, ModelManagement).readiness()
    return JSONResponse(body, status_code=200 if ready_now else 503)


@router.get(
    "/api/health/inference",
    summary="Scheduler state: backend, queue depth, batch size, requests per backend",
)
def inference(request: Request):
    """Which backend serves generation, what waits and runs now, and jobs served / cancelled /
    failed per backend."""
    return part(request, ModelManagement).inference_stats()
