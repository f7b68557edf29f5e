"""/api/vectors: steering vectors trained from contrasting prompt pairs (a job), stored, exported,
imported, and explained through an SAE's decoder."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from millm.formats.vector_file import VectorFile
from millm.kernel.books.vectors import VectorBook, VectorDeleted, VectorList, VectorView
from millm.kernel.runtime.jobs import JobView
from millm.lab.vectors.protocol import ExplainK, TrainVectorRequest, VectorExplanation
from millm.lab.vectors.service import VectorTraining
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/vectors/train",
    summary="Train a steering vector from contrasting prompt pairs (a job)",
    status_code=202,
    response_model=JobView,
    responses={
        202: {
            "description": "The job, started: follow it at GET /api/jobs/{id}; its result is the "
            "stored vector"
        }
    },
)
def train_vector(body: TrainVectorRequest, request: Request) -> JSONResponse:
    """Read each pair's texts unsteered at the layer, pool each text's residuals (the mean over
    every position but the first), and store the difference of means (or the first principal
    direction) as a unit vector and its norm."""
    view = part(request, VectorTraining).train(body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get("/api/vectors", summary="Steering vectors, oldest first", response_model=VectorList)
def list_vectors(request: Request) -> VectorList:
    """Every stored vector (without its values: export one for them)."""
    return part(request, VectorBook).list()


@router.post(
    "/api/vectors/import",
    summary="Import a steering-vector file",
    status_code=201,
    response_model=VectorView,
)
def import_vector(
    body: VectorFile, request: Request, on_conflict: Literal["fail", "rename"] = "fail"
) -> VectorView:
    """A millm.steering-vector file (as exported), stored bit for bit; a taken name is 409
    vector_exists, or renamed (name-2, ...)."""
    return part(request, VectorBook).import_file(body, on_conflict)


@router.get("/api/vectors/{key}", summary="One steering vector", response_model=VectorView)
def get_vector(key: str, request: Request) -> VectorView:
    """A vector by id or name (404 vector_not_found)."""
    return part(request, VectorBook).get(key)


@router.delete(
    "/api/vectors/{key}", summary="Delete a steering vector", response_model=VectorDeleted
)
def delete_vector(key: str, request: Request) -> VectorDeleted:
    """Forget a vector; plans resolved from now on refuse it."""
    return part(request, VectorBook).delete(key)


@router.get(
    "/api/vectors/{key}/export", summary="A steering vector as a file", response_model=VectorFile
)
def export_vector(key: str, request: Request) -> JSONResponse:
    """The millm.steering-vector file: metadata and the unit direction's d_model values; it
    imports bit for bit."""
    document = part(request, VectorBook).export(key)
    return JSONResponse(
        document, headers={"Content-Disposition": f'attachment; filename="{document["name"]}.json"'}
    )


@router.get(
    "/api/vectors/{key}/explain",
    summary="The SAE features a steering vector is made of",
    response_model=VectorExplanation,
)
async def explain(
    key: str,
    request: Request,
    sae_id: Annotated[
        str | None, Query(description="The SAE (default: the one attached at the vector's point).")
    ] = None,
    k: Annotated[ExplainK, Query()] = 10,
) -> VectorExplanation:
    """The k features whose decoder rows have the largest |cosine| with the vector, with labels, and
    the fraction of the vector they explain (least-squares projection onto their rows' span); an
    SAE at another point is refused."""
    return await part(request, VectorTraining).explain(key, sae_id, k)
