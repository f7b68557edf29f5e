"""GET /api/health (liveness), /api/health/ready (503 until a model is loaded),
/api/health/inference, /api/health/gpus."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from millm.lab.models.service import ModelManagement
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)
RETRY_AFTER_READINESS = 5  # a probe polls; a load takes seconds to minutes


@router.get("/api/health", summary="Liveness")
async def health():
    """The process is up and answering."""
    return {"status": "ok"}


@router.get("/api/health/ready", summary="Readiness: 200 once a model is loaded, else 503")
def ready(request: Request):
    """Whether requests can be served now, with the model's state (and load error, if any)."""
    body, ready_now = part(request, ModelManagement).readiness()
    if ready_now:
        return JSONResponse(body)
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_READINESS)})


@router.get(
    "/api/health/gpus", summary="Each NVIDIA card's memory, and what this process holds there"
)
def gpus(request: Request):
    """Per card: nvidia-smi's total, used and free MiB and its processes, and torch's allocated and
    reserved MiB where a model of this process was placed (null where unmeasured; no cards and a
    reason without nvidia-smi). Takes no place in the request queue."""
    return part(request, ModelManagement).gpus()


@router.get(
    "/api/health/inference",
    summary="Scheduler state: backend, queue depth, batch size, requests per backend",
)
def inference(request: Request):
    """Which backend serves generation, what waits and runs now, and jobs served / cancelled /
    failed per backend."""
    return part(request, ModelManagement).inference_stats()
