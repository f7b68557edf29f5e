"""/api/jobs: long work (calibration, AutoSteer, probe and vector training) as jobs with
progress, an ETA and cancellation."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.kernel.runtime.jobs import JobBook, JobView
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.get("/api/jobs", summary="Jobs, newest first")
def list_jobs(request: Request) -> dict:
    """Every job the server remembers (the last 50 ended ones and all running ones)."""
    return {"object": "list", "data": [view.model_dump() for view in part(request, JobBook).all()]}


@router.get(
    "/api/jobs/{job_id}", summary="One job: state, progress, ETA, result", response_model=JobView
)
def get_job(job_id: str, request: Request) -> JobView:
    """The job's state, progress (done/total), when it started, its ETA, and its result or error
    once ended."""
    return part(request, JobBook).get(job_id)


@router.delete("/api/jobs/{job_id}", summary="Cancel a job", response_model=JobView)
def cancel_job(job_id: str, request: Request) -> JobView:
    """Ask a running job to stop; it ends as `cancelled` within a forward pass. An ended job is
    returned unchanged."""
    return part(request, JobBook).cancel(job_id)
