"""The management API for models (/api/models): register, list, get, load, unload, delete, lock,
unlock.

Loads and unloads block (a load reads the weights; an unload waits for running requests), so
they run on a worker thread and the route answers when they are done.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from millm.lab.models.protocol import LeaseRequest, RegisterModel, RenewLease
from millm.lab.models.service import ModelManagement
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post("/api/models", summary="Register a model (checkpoint directory, .gguf file or hub id)")
def register_model(body: RegisterModel, request: Request):
    """Resolve and check the files; 201 when new, 200 when the same name and source were
    registered already."""
    view, created = part(request, ModelManagement).register_model(body.source, body.name)
    return JSONResponse(view, status_code=201 if created else 200)


@router.get("/api/models", summary="List registered models with their states")
def list_models(request: Request):
    """Every registered model (ready, loading, loaded, unloading or error) and the steering lock."""
    return part(request, ModelManagement).list_registered()


@router.post("/api/models/{name:path}/load", summary="Load a model (replacing the loaded one)")
async def load_model(name: str, request: Request):
    """Checks first (quantization, memory), then unloads the loaded model gracefully, then loads."""
    return await part(request, ModelManagement).load_model(name)


@router.post("/api/models/{name:path}/unload", summary="Unload a model")
async def unload_model(name: str, request: Request):
    """Refuse new requests at once, let running ones finish (GRACEFUL_UNLOAD_TIMEOUT), free the
    weights."""
    return await part(request, ModelManagement).unload_model(name)


@router.post("/api/models/{name:path}/lock", summary="Lock the server to a model for steering")
def lock_model(name: str, request: Request):
    """Only this model is listed and served; requests naming another get 409 model_locked."""
    return part(request, ModelManagement).lock_model(name)


@router.post("/api/models/{name:path}/unlock", summary="Release the steering lock")
def unlock_model(name: str, request: Request):
    """Refused (409 sae_attached) while SAEs are attached: steering is bound to this model."""
    return part(request, ModelManagement).unlock_model(name)


@router.post("/api/models/{name:path}/lease", summary="Lease the loaded model", status_code=201)
def grant_lease(name: str, body: LeaseRequest, request: Request):
    """While the lease lives, nothing may swap the model away without the lease's id
    (X-miLLM-Lease); the id is in this answer only."""
    return part(request, ModelManagement).grant_lease(name, body)


@router.get("/api/models/{name:path}/lease", summary="The lease on a model")
def lease(name: str, request: Request):
    """The live lease (holder, reason, expiry; never its id) and the last one that ended."""
    return part(request, ModelManagement).lease(name)


@router.post("/api/models/{name:path}/lease/renew", summary="Renew a lease (X-miLLM-Lease)")
def renew_lease(name: str, body: RenewLease, request: Request):
    """The lease ends ttl_seconds from now (7200 by default)."""
    return part(request, ModelManagement).renew_lease(name, body)


@router.delete("/api/models/{name:path}/lease", summary="Release a lease (X-miLLM-Lease)")
def release_lease(name: str, request: Request):
    """End the lease; swaps are allowed again."""
    return part(request, ModelManagement).release_lease(name)


@router.get("/api/models/{name:path}", summary="One registered model")
def get_model(name: str, request: Request):
    """A model's registration and state."""
    return part(request, ModelManagement).get_model(name)


@router.delete("/api/models/{name:path}", summary="Forget a model (unload it first)")
def delete_model(name: str, request: Request):
    """Remove the registration; 409 while it is loaded or locked. Its files are left alone."""
    return part(request, ModelManagement).delete_model(name)
