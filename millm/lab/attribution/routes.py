"""POST /api/attribution: an attribution graph; GET /api/attribution/{id} and its export; import of
circuit-tracer's JSON; a profile or a miStudio circuit of a graph's chosen features.

POST /api/attribution is inference-class (the API key opens it, see server/access.py): it reads the
model and changes nothing stored; its work runs on the scheduler thread in steps, and a client that
leaves cancels it. Import, profile and circuit are admin routes: they keep a graph or store a
document.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from millm.kernel.runtime.jobs import JobView
from millm.lab.attribution.protocol import (
    AttributionGraph,
    AttributionRequest,
    ImportedGraph,
    SubgraphCircuit,
    SubgraphProfile,
    TranscoderRegistration,
)
from millm.lab.attribution.service import Attribution
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute
from millm.v1.serving.http_replies import unless_client_leaves

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/attribution",
    summary="An attribution graph: which features drove a logit, checked by ablation",
    response_model=AttributionGraph,
)
async def attribute(body: AttributionRequest, request: Request) -> AttributionGraph:
    """The prompt's target logit traced to the attached SAEs' features (circuit-tracer's method on
    the served model), pruned by influence, its top nodes ablated on the served model; unsteered
    unless `steering` asks."""
    return await unless_client_leaves(request, part(request, Attribution).attribute(body))


@router.post(
    "/api/attribution/jobs",
    summary="An attribution graph as a job (for long prompts and large budgets)",
    status_code=202,
    response_model=JobView,
    responses={202: {"description": "The job, started: follow it at GET /api/jobs/{id}"}},
)
async def attribute_job(body: AttributionRequest, request: Request) -> JSONResponse:
    """The same graph as POST /api/attribution, checked now and traced as a job; its result
    names the graph (GET /api/attribution/{id})."""
    view = await part(request, Attribution).start_job(body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get(
    "/api/attribution/{graph_id}",
    summary="A recent attribution graph",
    response_model=AttributionGraph,
)
def graph(graph_id: str, request: Request) -> AttributionGraph:
    """One of the last graphs computed (kept in memory)."""
    return part(request, Attribution).graph(graph_id)


@router.get(
    "/api/attribution/{graph_id}/export",
    summary="A recent graph in circuit-tracer's JSON (Neuronpedia's graph viewer reads it)",
)
def export(graph_id: str, request: Request) -> dict[str, Any]:
    """metadata, qParams, nodes and links as circuit-tracer's create_graph_files writes them."""
    return part(request, Attribution).export(graph_id)


@router.post(
    "/api/attribution/import",
    summary="Keep a graph from circuit-tracer's JSON (circuit-tracer, Neuronpedia, an export)",
    response_model=AttributionGraph,
)
def import_graph(document: ImportedGraph, request: Request) -> AttributionGraph:
    """The graph as millm shows it (method `imported`: no scores, no check), kept like a computed
    one."""
    return part(request, Attribution).import_graph(document)


@router.post(
    "/api/attribution/{graph_id}/profile",
    summary="A steering profile of a graph's chosen feature nodes",
    status_code=201,
)
def subgraph_profile(graph_id: str, body: SubgraphProfile, request: Request) -> dict[str, Any]:
    """Ablate (or add at a strength) the chosen nodes' features, stored as a millm.profile
    (version 2)."""
    return part(request, Attribution).profile(graph_id, body)


@router.post(
    "/api/attribution/{graph_id}/circuit",
    summary="A miStudio circuit of a graph's chosen feature nodes",
    status_code=201,
)
def subgraph_circuit(graph_id: str, body: SubgraphCircuit, request: Request) -> dict[str, Any]:
    """The chosen features as feature_ref members at one strength, the graph's edges between them
    at rung 1 (attribution-supported), stored as an imported circuit (GET /api/circuits)."""
    return part(request, Attribution).circuit(graph_id, body)


@router.post(
    "/api/transcoders",
    summary="Register a transcoder set (circuit-tracer's format) as a source of attribution graphs",
    status_code=201,
)
async def register_transcoders(body: TranscoderRegistration, request: Request) -> dict[str, Any]:
    """Read a set from a directory the server may read, check it fits the loaded model, keep it
    in memory."""
    return await part(request, Attribution).register_transcoders(body.path)


@router.get("/api/transcoders", summary="The registered transcoder sets")
def transcoder_sets(request: Request) -> dict[str, Any]:
    """Every registered set: its blocks, widths, activation and hooks."""
    return part(request, Attribution).transcoder_sets()


@router.get("/api/transcoders/{set_id}", summary="A registered transcoder set")
def transcoder_set(set_id: str, request: Request) -> dict[str, Any]:
    """One set (404 transcoder_set_not_found)."""
    return part(request, Attribution).transcoder_set(set_id)


@router.delete("/api/transcoders/{set_id}", summary="Forget a transcoder set")
def delete_transcoders(set_id: str, request: Request) -> dict[str, Any]:
    """The set is no longer a source; graphs already made keep their nodes."""
    return part(request, Attribution).delete_transcoders(set_id)
