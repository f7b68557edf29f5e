"""GET /v1/models and /v1/models/{id}: the models clients can name, in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute
from millm.v1.models.serving import ModelListing

router = APIRouter(route_class=JsonRoute)


@router.get("/v1/models", summary="List available models")
def list_models(request: Request):
    """The models clients can name in requests."""
    return part(request, ModelListing).listed().model_dump()


@router.get("/v1/models/{model_id:path}", summary="Model metadata")
def get_model(model_id: str, request: Request):
    """One model's card; 404 model_not_found for a name that is not listed."""
    return part(request, ModelListing).card(model_id).model_dump()
