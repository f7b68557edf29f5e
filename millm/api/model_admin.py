"""The management API for models (/api/models): register, list, get, load, unload, delete, lock, unlock.

Loads and unloads block (a load reads the weights; an unload waits for running requests), so
they run on a worker thread and the route answers when they are done.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from millm.api.manage import StrictBody
from millm.service.state import ModelView, ServerState
from millm.service.threads import in_passing_thread

router = APIRouter()


class RegisterModel(StrictBody):
    """A checkpoint directory, a .gguf file or a Hugging Face hub id; `name` defaults to the source's."""

    source: Annotated[str, Field(min_length=1, description="A checkpoint directory or .gguf file (inside the data directory or MILLM_ALLOWED_PATHS), or a hub id.")]
    # check_name's rule (1-200 printable characters, no surrounding spaces), stated in ASCII for generators.
    name: Annotated[str, Field(json_schema_extra={"pattern": r"^[!-~](?:[ -~]{0,198}[!-~])?$"})] | None = None


def state_of(request: Request) -> ServerState:
    """The server state behind this app."""
    return request.app.state.millm


def model_view(view: ModelView) -> dict:
    """A registered model as the management API shows it."""
    body = {"object": "model", **view.entry.to_dict(), "state": view.state.value, "locked": view.locked}
    if view.error is not None:
        body["error"] = view.error
    if view.lm is not None:
        body["loaded"] = {
            "device": str(view.lm.device),
            "dtype": view.lm.dtype_name,
            "max_model_len": view.lm.context_length,
            "system_fingerprint": view.lm.system_fingerprint,
        }
    return body


@router.post("/api/models", summary="Register a model (checkpoint directory, .gguf file or hub id)")
async def register_model(body: RegisterModel, request: Request):
    """Resolve and check the files; 201 when new, 200 when the same name and source were registered already."""
    state = state_of(request)
    entry, created = await run_in_threadpool(state.registrations.model, body.source, body.name)
    return JSONResponse(model_view(state.view(entry.name)), status_code=201 if created else 200)


@router.get("/api/models", summary="List registered models with their states")
async def list_models(request: Request):
    """Every registered model (ready, loading, loaded, unloading or error) and the steering lock."""
    state = state_of(request)
    return {"object": "list", "locked": state.locked, "data": [model_view(view) for view in state.views()]}


@router.post("/api/models/{name:path}/load", summary="Load a model (replacing the loaded one)")
async def load_model(name: str, request: Request):
    """Checks first (quantization, memory), then unloads the loaded model gracefully, then loads."""
    state = state_of(request)
    await in_passing_thread(state.load, name)
    return {**model_view(state.view(name)), "active_base": state.planner.active_fit()}


@router.post("/api/models/{name:path}/unload", summary="Unload a model")
async def unload_model(name: str, request: Request):
    """Refuse new requests at once, let running ones finish (GRACEFUL_UNLOAD_TIMEOUT), free the weights."""
    state = state_of(request)
    was = await in_passing_thread(state.unload, name)
    return {**model_view(state.view(name)), "was_loaded": was, "active_base": state.planner.active_fit()}


@router.post("/api/models/{name:path}/lock", summary="Lock the server to a model for steering")
async def lock_model(name: str, request: Request):
    """Only this model is listed and served; requests naming another get 409 model_locked."""
    state = state_of(request)
    state.lock(name)
    return model_view(state.view(name))


@router.post("/api/models/{name:path}/unlock", summary="Release the steering lock")
async def unlock_model(name: str, request: Request):
    """Refused (409 sae_attached) while SAEs are attached: steering is bound to this model."""
    state = state_of(request)
    was = state.unlock(name)
    return {**model_view(state.view(name)), "was_locked": was}


@router.get("/api/models/{name:path}", summary="One registered model")
async def get_model(name: str, request: Request):
    """A model's registration and state."""
    return model_view(state_of(request).view(name))


@router.delete("/api/models/{name:path}", summary="Forget a model (unload it first)")
async def delete_model(name: str, request: Request):
    """Remove the registration; 409 while it is loaded or locked. Its files are left alone."""
    state = state_of(request)
    state.forget(name)
    return {"id": name, "object": "model", "deleted": True}
