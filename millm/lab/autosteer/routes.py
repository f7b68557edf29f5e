"""/api/autosteer: from a plain-language goal to ranked steering settings, as a job."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.kernel.runtime.jobs import JobView
from millm.lab.autosteer.protocol import AutoSteerRequest
from millm.lab.autosteer.service import AutoSteer
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/autosteer",
    summary="Find a steering setting for a goal (a job)",
    status_code=202,
    response_model=JobView,
)
def autosteer(body: AutoSteerRequest, request: Request) -> JobView:
    """Start AutoSteer; follow it at GET /api/jobs/{id}, whose result ranks the settings
    (AutoSteerResult)."""
    return part(request, AutoSteer).start(body)
