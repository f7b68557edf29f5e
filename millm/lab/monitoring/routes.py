"""/api/monitoring: live feature monitoring settings, per-request records, statistics, a live SSE
feed."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from millm.kernel.monitoring.monitor import Monitor
from millm.lab.monitoring.protocol import MonitoringSettings
from millm.lab.monitoring.service import MonitorManagement
from millm.v1.http.deps import part
from millm.v1.http.feeds import feed_response
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.get("/api/monitoring", summary="Monitoring settings, what it reads through, counters")
def get_monitoring(request: Request):
    """Whether monitoring is on, the SAE and features it watches, and how much it has recorded."""
    return part(request, MonitorManagement).describe()


@router.put("/api/monitoring", summary="Change monitoring settings (validated whole)")
def put_monitoring(settings: MonitoringSettings, request: Request):
    """Set any of enabled, sae_id, features (null: all), top_k, positions, percentiles, tokens,
    labels; stored across restarts."""
    return part(request, MonitorManagement).configure(settings.model_dump(exclude_unset=True))


@router.post("/api/monitoring/enable", summary="Turn monitoring on")
def enable(request: Request):
    """Monitor every generation from now on (400 when no SAE can be read through)."""
    return part(request, MonitorManagement).configure({"enabled": True})


@router.post("/api/monitoring/disable", summary="Turn monitoring off")
def disable(request: Request):
    """Stop monitoring; records and statistics stay until reset."""
    return part(request, MonitorManagement).configure({"enabled": False})


@router.get("/api/monitoring/records", summary="Per-request records, oldest first")
def records(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    after: int | None = None,
    origin: Literal["request", "batch"] = "request",
    batch_id: str | None = None,
):
    """The last `limit` records, or those after record id `after` (poll with the last id seen):
    of live requests, or with `origin=batch` of batches' lines (`batch_id`: one batch's)."""
    monitor = part(request, Monitor)
    return {"object": "list", "data": monitor.recent(limit, after, origin, batch_id)}


@router.get(
    "/api/monitoring/requests/{request_id}",
    summary="A recorded request's prompts, as the model read them",
)
def monitored_request(request_id: str, request: Request):
    """The prompts of the request a record names (its `request_id`), chat template applied, each
    cut past MONITORING_PROMPT_MAX_CHARS; 404 once no record of it is kept."""
    return part(request, Monitor).prompt(request_id)


@router.get("/api/monitoring/stats", summary="Per-feature statistics since the last reset")
def stats(request: Request):
    """For each feature that fired: count, mean and max value when active, fraction of positions
    active."""
    return part(request, Monitor).statistics()


@router.post("/api/monitoring/reset", summary="Forget records and statistics")
def reset(request: Request):
    """Clear history and statistics (settings stay)."""
    return part(request, MonitorManagement).reset()


@router.get("/api/monitoring/stream", summary="Live feed of records (server-sent events)")
async def stream(request: Request):
    """Each new record as one SSE `data:` frame (JSON), comments as keep-alives; for a page to
    chart."""
    return feed_response(request, part(request, Monitor).feed, "monitoring feed")
