"""/api/saes/{id}/calibrate and /api/saes/{id}/calibration: calibrate an SAE on the loaded model
(a job), read or forget the result."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from millm.kernel.books.calibrations import CalibrationView
from millm.kernel.runtime.jobs import JobView
from millm.lab.calibration.protocol import CalibrateRequest
from millm.lab.calibration.service import CalibrationManagement
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/saes/{sae_id}/calibrate",
    summary="Calibrate an SAE on the loaded model (a job)",
    status_code=202,
    response_model=JobView,
    responses={202: {"description": "The job, started: follow it at GET /api/jobs/{id}"}},
)
def calibrate(sae_id: str, body: CalibrateRequest, request: Request) -> JSONResponse:
    """Read the demo corpus or the texts and conversations sent through the attached SAE: per
    feature, firing frequency, mean and max activation, p50/p90/p99 where it fires, and the top
    snippets."""
    view = part(request, CalibrationManagement).start(sae_id, body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get(
    "/api/saes/{sae_id}/calibration",
    summary="An SAE's calibration on a model",
    response_model=CalibrationView,
)
def get_calibration(
    sae_id: str,
    request: Request,
    features: Annotated[
        str | None,
        Query(description="Comma-separated feature indices whose figures to return (e.g. 12,40)."),
    ] = None,
    model: Annotated[
        str | None, Query(description="The served model name (default: the server's model).")
    ] = None,
) -> CalibrationView:
    """The calibration's summary, and the figures and top examples of `features`; 404
    calibration_not_found when there is none."""
    return part(request, CalibrationManagement).view(sae_id, model, features)


@router.delete("/api/saes/{sae_id}/calibration", summary="Forget an SAE's calibration on a model")
def delete_calibration(
    sae_id: str,
    request: Request,
    model: Annotated[
        str | None, Query(description="The served model name (default: the server's model).")
    ] = None,
) -> dict:
    """Forget the calibration (percentiles read null from then on); 404 calibration_not_found
    when there is none."""
    return part(request, CalibrationManagement).delete(sae_id, model)
