"""/api/monitoring: live feature monitoring settings, per-request records, statistics, a live SSE feed."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from millm.service.monitoring import MAX_TOP_K, POSITION_WORDS
from millm.service.state import ServerState

router = APIRouter()
KEEPALIVE_SECONDS = 15.0


class MonitoringSettings(BaseModel):
    """Fields to change; those left out keep their value."""

    model_config = ConfigDict(strict=True, extra="forbid")

    # Absent keeps the stored value; only sae_id and features take null (the only SAE; all features).
    enabled: bool = None
    sae_id: str | None = Field(None, description="The attached SAE to read through (default: the only one attached).")
    features: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="Features to watch; null = all.")
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = Field(None, description=f"Features kept per position (1-{MAX_TOP_K}).")
    positions: Literal[POSITION_WORDS] = Field(None, description="last, prompt, completion (default) or all.")


def _state(request: Request) -> ServerState:
    return request.app.state.millm


def _describe(state: ServerState) -> dict:
    return state.monitor.describe(state.steering.attached)


@router.get("/api/monitoring", summary="Monitoring settings, what it reads through, counters")
async def get_monitoring(request: Request):
    """Whether monitoring is on, the SAE and features it watches, and how much it has recorded."""
    return _describe(_state(request))


@router.put("/api/monitoring", summary="Change monitoring settings (validated whole)")
async def put_monitoring(settings: MonitoringSettings, request: Request):
    """Set any of enabled, sae_id, features (null: all), top_k, positions; stored across restarts."""
    state = _state(request)
    return state.monitor.configure(settings.model_dump(exclude_unset=True), state.steering.attached, state.saes.get)


@router.post("/api/monitoring/enable", summary="Turn monitoring on")
async def enable(request: Request):
    """Monitor every generation from now on (400 when no SAE can be read through)."""
    state = _state(request)
    return state.monitor.configure({"enabled": True}, state.steering.attached, state.saes.get)


@router.post("/api/monitoring/disable", summary="Turn monitoring off")
async def disable(request: Request):
    """Stop monitoring; records and statistics stay until reset."""
    state = _state(request)
    return state.monitor.configure({"enabled": False}, state.steering.attached, state.saes.get)


@router.get("/api/monitoring/records", summary="Per-request records, oldest first")
async def records(request: Request, limit: Annotated[int, Query(ge=1, le=10_000)] = 100, after: int | None = None):
    """The last `limit` records, or those after record id `after` (poll with the last id seen)."""
    return {"object": "list", "data": _state(request).monitor.recent(limit, after)}


@router.get("/api/monitoring/stats", summary="Per-feature statistics since the last reset")
async def stats(request: Request):
    """For each feature that fired: count, mean and max value when active, fraction of positions active."""
    return _state(request).monitor.statistics()


@router.post("/api/monitoring/reset", summary="Forget records and statistics")
async def reset(request: Request):
    """Clear history and statistics (settings stay)."""
    monitor = _state(request).monitor
    monitor.reset()
    return {"reset": True, **monitor.statistics()}


@router.get("/api/monitoring/stream", summary="Live feed of records (server-sent events)")
async def stream(request: Request):
    """Each new record as one SSE `data:` frame (JSON), comments as keep-alives; for a page to chart."""
    monitor = _state(request).monitor
    subscriber = monitor.subscribe()

    async def frames():
        try:
            yield ": monitoring feed\n\n"
            while True:
                try:
                    record = await asyncio.wait_for(subscriber.queue.get(), KEEPALIVE_SECONDS)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    yield ": keep-alive\n\n"
                    continue
                yield f"data: {json.dumps(record)}\n\n"
        finally:
            monitor.unsubscribe(subscriber)

    return StreamingResponse(frames(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
