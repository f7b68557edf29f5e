"""POST /api/saes/{id}/inspect and /api/saes/{id}/contrast: discovery reads through an attached SAE;
POST /api/lens: the logit lens.

Inference-class routes (the API key opens them, see server/access.py): they read the model and
change nothing. The work runs on the scheduler thread; a client that leaves cancels it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.lab.discovery.lens_protocol import LensRequest, LensResponse
from millm.lab.discovery.protocol import (
    ContrastRequest,
    ContrastResponse,
    InspectRequest,
    InspectResponse,
)
from millm.lab.discovery.service import Discovery
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute
from millm.v1.serving.http_replies import unless_client_leaves

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/saes/{sae_id}/inspect",
    summary="The features that fire on a text or conversation",
    response_model=InspectResponse,
)
async def inspect(sae_id: str, body: InspectRequest, request: Request) -> InspectResponse:
    """Top features over the read positions (max, mean, count), with labels, and one feature's
    activation per token; unsteered unless `steering` asks."""
    return await unless_client_leaves(request, part(request, Discovery).inspect(sae_id, body))


@router.post(
    "/api/saes/{sae_id}/contrast",
    summary="The features that separate two sets of texts",
    response_model=ContrastResponse,
)
async def contrast(sae_id: str, body: ContrastRequest, request: Request) -> ContrastResponse:
    """Per feature: each set's mean per-text value, the difference and Cohen's d; the top_k
    favouring each set, with labels."""
    return await unless_client_leaves(request, part(request, Discovery).contrast(sae_id, body))


@router.post(
    "/api/lens",
    summary="The logit lens: what each block's residual predicts at each position",
    response_model=LensResponse,
)
async def lens(body: LensRequest, request: Request) -> LensResponse:
    """Each chosen block's output through the model's final norm and head: the top tokens per
    position, and the probability each block gives the model's final prediction; unsteered unless
    `steering` asks."""
    return await unless_client_leaves(request, part(request, Discovery).lens(body))
