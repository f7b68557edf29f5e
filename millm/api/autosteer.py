"""/api/autosteer: from a plain-language goal to ranked steering settings, as a job."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.api.deps import facades
from millm.api.json_body import JsonRoute
from millm.protocol.autosteer import AutoSteerRequest
from millm.service.runtime.jobs import JobView

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/autosteer",
    summary="Find a steering setting for a goal (a job)",
    status_code=202,
    response_model=JobView,
)
def autosteer(body: AutoSteerRequest, request: Request) -> JobView:
    """Start AutoSteer; follow it at GET /api/jobs/{id}, whose result ranks the settings (AutoSteerResult)."""
    return facades(request).training.autosteer(body)
