"""/api/evaluations: steering evaluations in AxBench's terms (issue 34, beyond the spec)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from millm.kernel.runtime.jobs import JobView
from millm.lab.evaluations.book import EvaluationBook
from millm.lab.evaluations.protocol import (
    EvaluationDeleted,
    EvaluationList,
    EvaluationRequest,
    EvaluationResult,
)
from millm.lab.evaluations.service import EvaluationManagement
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/evaluations",
    summary="Evaluate steering candidates for a concept (a job)",
    status_code=202,
    response_model=JobView,
    responses={
        202: {
            "description": "The job, started: follow it at GET /api/jobs/{id}; its result is the "
            "stored evaluation"
        }
    },
)
def start_evaluation(body: EvaluationRequest, request: Request) -> JSONResponse:
    """Every candidate at every strength answers every instruction; the answers are rated for the
    concept, the instruction and fluency (0-2), and their perplexity measured under the unsteered
    model."""
    view = part(request, EvaluationManagement).start(body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get(
    "/api/evaluations", summary="Stored evaluations, newest first", response_model=EvaluationList
)
def list_evaluations(request: Request) -> EvaluationList:
    """Every stored evaluation with its ranking (the answers come with each one)."""
    return part(request, EvaluationBook).list()


@router.get(
    "/api/evaluations/{evaluation_id}", summary="One evaluation", response_model=EvaluationResult
)
def get_evaluation(evaluation_id: str, request: Request) -> EvaluationResult:
    """An evaluation whole: its points, their answers and the ranking (404 evaluation_not_found)."""
    return part(request, EvaluationBook).get(evaluation_id)


@router.get(
    "/api/evaluations/{evaluation_id}/export",
    summary="One evaluation as a file (JSON or CSV)",
    response_model=EvaluationResult,
    responses={200: {"content": {"text/csv": {}}}},
)
def export_evaluation(
    evaluation_id: str, request: Request, format: Literal["json", "csv"] = "json"
) -> Response:
    """The stored document (json), or one CSV line per answer (csv), as an attachment."""
    evaluations = part(request, EvaluationBook)
    if format == "csv":
        return Response(
            evaluations.csv(evaluation_id),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{evaluation_id}.csv"'},
        )
    document = evaluations.get(evaluation_id).model_dump(mode="json")
    return JSONResponse(
        document, headers={"Content-Disposition": f'attachment; filename="{evaluation_id}.json"'}
    )


@router.delete(
    "/api/evaluations/{evaluation_id}",
    summary="Delete an evaluation",
    response_model=EvaluationDeleted,
)
def delete_evaluation(evaluation_id: str, request: Request) -> EvaluationDeleted:
    """Forget a stored evaluation."""
    return part(request, EvaluationBook).delete(evaluation_id)
