"""/api/probes: saved probes (CRUD, import, export, which are active), training a linear probe
(a job), and scoring probes over given inputs."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from millm.kernel.runtime.jobs import JobView
from millm.lab.probes.protocol import ProbeUpdate
from millm.lab.probes.score_protocol import ProbeScoreRequest, ProbeScores
from millm.lab.probes.scoring import ProbeScoring
from millm.lab.probes.service import ProbeManagement
from millm.lab.probes.training import ProbeTrainRequest
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


# Literal paths first: "export", "import", "train" must not be read as a probe's key.
@router.get("/api/probes", summary="List probes")
def list_probes(request: Request):
    """Every saved probe, with whether it is active."""
    return part(request, ProbeManagement).list_probes()


@router.post("/api/probes", summary="Create a probe", status_code=201)
def create_probe(request: Request, payload: Annotated[dict, Body()]):
    """A new probe from a millm.probe document (kind and version may be left out); 409
    probe_exists when the name is taken."""
    return part(request, ProbeManagement).create_probe(payload)


@router.get("/api/probes/export", summary="Export every probe as a bundle")
def export_all(request: Request):
    """A millm.probe-bundle document of all probes."""
    return part(request, ProbeManagement).export_probes()


@router.post("/api/probes/import", summary="Import a probe document or a bundle", status_code=201)
def import_probes(
    request: Request,
    payload: Annotated[dict, Body()],
    on_conflict: Literal["fail", "rename"] = "fail",
):
    """Validated whole: a bad document refuses the import and nothing is stored. Imported probes
    are inactive."""
    return part(request, ProbeManagement).import_probes(payload, on_conflict)


@router.post(
    "/api/probes/train",
    summary="Train a linear probe from labelled texts (a job)",
    status_code=202,
    response_model=JobView,
    responses={202: {"description": "The job, started: follow it at GET /api/jobs/{id}"}},
)
def train(body: ProbeTrainRequest, request: Request) -> JSONResponse:
    """Read each text's residual (mean over its positions but the first), fit a logistic regression
    on a seeded stratified split, and store the probe with its held-out accuracy and AUC (in the
    job's result too)."""
    view = part(request, ProbeManagement).train(body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.post(
    "/api/probes/score",
    summary="Score probes over given inputs (unsteered, recording nothing)",
    response_model=ProbeScores,
)
async def score(body: ProbeScoreRequest, request: Request) -> ProbeScores:
    """Each probe over each input (token ids, a conversation or a text), per window (`all`,
    `prompt`, `response`, `last_user`): where it fired and its peak, as a watch during generation
    would say; one unsteered pass per input, nothing recorded."""
    return await part(request, ProbeScoring).score(body)


@router.get("/api/probes/{key}", summary="One probe")
def get_probe(key: str, request: Request):
    """A probe by id or name."""
    return part(request, ProbeManagement).get_probe(key)


@router.put("/api/probes/{key}", summary="Update a probe")
def update_probe(key: str, body: ProbeUpdate, request: Request):
    """Replace the given fields; the result is validated whole (an active probe must still fit
    the loaded model)."""
    return part(request, ProbeManagement).update_probe(key, body.model_dump(exclude_none=True))


@router.delete("/api/probes/{key}", summary="Delete a probe")
def delete_probe(key: str, request: Request):
    """Remove a probe; an active one stops watching requests."""
    return part(request, ProbeManagement).delete_probe(key)


@router.get("/api/probes/{key}/export", summary="Export a probe document")
def export_probe(key: str, request: Request):
    """The versioned millm.probe document."""
    return part(request, ProbeManagement).export_probe(key)


@router.post("/api/probes/{key}/activate", summary="Make a probe watch every generation request")
def activate_probe(key: str, request: Request):
    """Checked against the loaded model first (its SAE attached, its percentile calibrated, its
    width and layer)."""
    return part(request, ProbeManagement).activate_probe(key)


@router.post("/api/probes/{key}/deactivate", summary="Stop a probe watching requests")
def deactivate_probe(key: str, request: Request):
    """Requests admitted from now on are not watched by it (unless they name it)."""
    return part(request, ProbeManagement).deactivate_probe(key)
