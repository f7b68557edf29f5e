"""GET /v1/models and /v1/models/{id}: the models clients can name, in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.errors import ModelNotFound
from millm.service.models import AVAILABLE
from millm.service.state import ModelView, ServerState

router = APIRouter()


def model_card(view: ModelView) -> dict:
    """OpenAI's model object, plus vLLM's max_model_len while the model is loaded."""
    card = {"id": view.entry.name, "object": "model", "created": int(view.entry.registered_at), "owned_by": view.entry.owned_by}
    if view.lm is not None:
        card["max_model_len"] = view.lm.context_length
    return card


def listed(state: ServerState) -> list[ModelView]:
    """Registered models that are available (ready, loading, loaded, unloading); under a steering
    lock only the locked model, so a steered server presents one stable id. A model whose load
    failed is not available."""
    views = [view for view in state.views() if view.state in AVAILABLE]
    if state.locked is not None:
        views = [view for view in views if view.entry.name == state.locked]
    return views


@router.get("/v1/models", summary="List available models")
async def list_models(request: Request):
    """The models clients can name in requests."""
    return {"object": "list", "data": [model_card(view) for view in listed(request.app.state.millm)]}


@router.get("/v1/models/{model_id:path}", summary="Model metadata")
async def get_model(model_id: str, request: Request):
    """One model's card; 404 model_not_found for a name that is not listed."""
    for view in listed(request.app.state.millm):
        if view.entry.name == model_id:
            return model_card(view)
    raise ModelNotFound(f"The model {model_id!r} does not exist on this server", param="model")
