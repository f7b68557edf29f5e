"""GET /v1/models and /v1/models/{id}: the model this server serves, in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.errors import ModelNotFound
from millm.service.state import ModelStatus, ServerState

router = APIRouter()


def model_card(state: ServerState) -> dict:
    """OpenAI's model object, plus vLLM's max_model_len once the window is known."""
    card = {"id": state.expected_name, "object": "model", "created": state.created, "owned_by": state.source.owned_by}
    if state.lm is not None:
        card["max_model_len"] = state.lm.context_length
    return card


def listed(state: ServerState) -> bool:
    """Loaded and loading models are listed; one that failed to load is not available."""
    return state.status in (ModelStatus.LOADED, ModelStatus.LOADING)


@router.get("/v1/models", summary="List available models")
async def list_models(request: Request):
    """The models clients can name in requests."""
    state: ServerState = request.app.state.millm
    return {"object": "list", "data": [model_card(state)] if listed(state) else []}


@router.get("/v1/models/{model_id:path}", summary="Model metadata")
async def get_model(model_id: str, request: Request):
    """One model's card; 404 model_not_found for a name the server does not serve."""
    state: ServerState = request.app.state.millm
    if model_id != state.expected_name or not listed(state):
        raise ModelNotFound(f"The model {model_id!r} does not exist on this server", param="model")
    return model_card(state)
