"""POST /api/attribution: an attribution graph; GET /api/attribution/{id} and its export.

POST is inference-class (the API key opens it, see access.py): it reads the model and changes
nothing stored. The work runs on the scheduler thread in steps; a client that leaves cancels it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from millm.api.deps import facades
from millm.api.replies import unless_client_leaves
from millm.protocol.attribution import AttributionGraph, AttributionRequest

router = APIRouter()


@router.post(
    "/api/attribution",
    summary="An attribution graph: which features drove a logit, checked by ablation",
    response_model=AttributionGraph,
)
async def attribute(body: AttributionRequest, request: Request) -> AttributionGraph:
    """The prompt's target logit traced to the attached SAEs' features (circuit-tracer's method on the
    served model), pruned by influence, its top nodes ablated on the served model; unsteered unless `steering` asks."""
    return await unless_client_leaves(request, facades(request).attribution.attribute(body))


@router.get(
    "/api/attribution/{graph_id}",
    summary="A recent attribution graph",
    response_model=AttributionGraph,
)
def graph(graph_id: str, request: Request) -> AttributionGraph:
    """One of the last graphs computed (kept in memory)."""
    return facades(request).attribution.graph(graph_id)


@router.get(
    "/api/attribution/{graph_id}/export",
    summary="A recent graph in circuit-tracer's JSON (Neuronpedia's graph viewer reads it)",
)
def export(graph_id: str, request: Request) -> dict[str, Any]:
    """metadata, qParams, nodes and links as circuit-tracer's create_graph_files writes them."""
    return facades(request).attribution.export(graph_id)
