"""/api/saes/train, /api/saes/trainings, /api/saes/{id}/grade(s) and /api/transcoders/{id}/grade(s):
train a dictionary on the served model (a job, resumed after a restart), follow or cancel it;
grade an attached SAE or a registered transcoder set (a job) and read its cards."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from millm.kernel.runtime.jobs import JobView
from millm.lab.dictionaries.protocol import GradeRequest, TrainingView, TrainRequest
from millm.lab.dictionaries.service import Dictionaries
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/saes/train",
    summary="Train an SAE on the served model with SAELens (a job)",
    status_code=202,
    response_model=TrainingView,
    responses={202: {"description": "The training, started: follow it at its GET"}},
)
def train(body: TrainRequest, request: Request) -> JSONResponse:
    """Read activations at a layer over a corpus and train a TopK, BatchTopK, JumpReLU or
    Matryoshka SAE on them; save it in SAELens's format with its provenance, register it, and
    attach, grade, calibrate and explain it as `then` asks."""
    view = part(request, Dictionaries).train(body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get("/api/saes/trainings", summary="Dictionary trainings, newest first")
def list_trainings(request: Request) -> dict:
    """Every training this server's store remembers, running or ended."""
    views = part(request, Dictionaries).all()
    return {"object": "list", "data": [view.model_dump(mode="json") for view in views]}


@router.get(
    "/api/saes/trainings/{training_id}", summary="One training", response_model=TrainingView
)
def get_training(training_id: str, request: Request) -> TrainingView:
    """Its state, progress (stage, tokens, steps, the loss, variance explained, L0 and dead
    curves) and, once ended, the dictionary it made or why not."""
    return part(request, Dictionaries).view(training_id)


@router.delete(
    "/api/saes/trainings/{training_id}", summary="Cancel a training", response_model=TrainingView
)
def cancel_training(training_id: str, request: Request) -> TrainingView:
    """Stop it within an engine call; it ends `cancelled`. An ended one is returned unchanged."""
    return part(request, Dictionaries).cancel(training_id)


@router.post(
    "/api/saes/trainings/{training_id}/resume",
    summary="Resume a failed training from its last checkpoint",
    status_code=202,
    response_model=TrainingView,
    responses={202: {"description": "The training, running again"}},
)
def resume_training(training_id: str, request: Request) -> JSONResponse:
    """A training that failed (its model unloaded mid-way, say) goes on from its last checkpoint
    once its model is loaded again; 409 training_not_resumable for any other."""
    view = part(request, Dictionaries).resume(training_id)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.post(
    "/api/saes/{sae_id}/grade",
    summary="Grade an attached SAE on a corpus (a job)",
    status_code=202,
    response_model=JobView,
    responses={202: {"description": "The job, started: follow it at GET /api/jobs/{id}"}},
)
def grade(sae_id: str, body: GradeRequest, request: Request) -> JSONResponse:
    """Variance explained, L0, dead and dense fractions, CE loss recovered against zero ablation
    and KL to the clean next-token distribution, on the served model; kept as a card."""
    view = part(request, Dictionaries).grade(sae_id, body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get("/api/saes/{sae_id}/grades", summary="An SAE's grade cards, newest first")
def grades(sae_id: str, request: Request) -> dict:
    """Every grade kept for the SAE."""
    return {"object": "list", "data": part(request, Dictionaries).grades(sae_id)}


@router.post(
    "/api/transcoders/{set_id}/grade",
    summary="Grade a registered transcoder set on a corpus (a job)",
    status_code=202,
    response_model=JobView,
    responses={202: {"description": "The job, started: follow it at GET /api/jobs/{id}"}},
)
def grade_set(set_id: str, body: GradeRequest, request: Request) -> JSONResponse:
    """The replacement model (every MLP replaced by its transcoder) against the model and against
    every MLP zeroed, and each block's variance explained, L0, dead and dense fractions; kept as a
    card."""
    view = part(request, Dictionaries).grade_set(set_id, body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get("/api/transcoders/{set_id}/grades", summary="A transcoder set's grade cards")
def set_grades(set_id: str, request: Request) -> dict:
    """Every grade kept for the set, newest first."""
    return {"object": "list", "data": part(request, Dictionaries).set_grades(set_id)}
