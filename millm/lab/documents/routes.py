"""/api/clusters and /api/circuits: import miStudio documents, export them raw, make one the
steering base.

The routes both kinds share (list, get, export, delete, deactivate) are made once per kind.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from millm.lab.documents import service as bases
from millm.lab.documents.claims import CircuitServing
from millm.lab.documents.protocol import CircuitActivation, Intensity
from millm.lab.documents.service import BaseManagement
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/clusters/import", summary="Import a cluster definition or bundle", status_code=201
)
async def import_clusters(
    request: Request, on_conflict: Literal["rename", "fail"] = "rename", activate: bool = False
):
    """Validated whole (1 MB cap); `activate` makes the (first) imported cluster the steering
    base."""
    raw = await request.body()
    return await run_in_threadpool(
        part(request, BaseManagement).import_clusters, raw, on_conflict, activate
    )


@router.put("/api/clusters/{key}/intensity", summary="Set a cluster's persistent dial")
def set_cluster_intensity(key: str, body: Intensity, request: Request):
    """Bounds [0, max]; survives restarts."""
    return part(request, BaseManagement).set_cluster_intensity(key, body.intensity)


@router.post("/api/clusters/{key}/activate", summary="Make a cluster the steering base")
def activate_cluster(key: str, request: Request):
    """n_features against the SAE's width and the layer are checked first."""
    return part(request, BaseManagement).activate_cluster(key)


@router.post("/api/circuits/import", summary="Import a circuit definition", status_code=201)
async def import_circuit(request: Request, on_conflict: Literal["rename", "fail"] = "rename"):
    """Validated whole (1 MB cap); stored byte for byte."""
    raw = await request.body()
    return await run_in_threadpool(part(request, BaseManagement).import_circuit, raw, on_conflict)


@router.get("/api/circuits/active", summary="The active circuits and whether each steers now")
def active_circuits(request: Request, single: bool = False):
    """A list: each active circuit with its claimed and composed layers, serving mode and
    `steering` (read it, not the row, before describing evidence); `single=true` gives the first
    as one object (the shape of a server with one active circuit)."""
    return part(request, CircuitServing).active(single)


@router.get("/api/circuits/claims", summary="The layers active circuits claim")
def circuit_claims(request: Request):
    """Every live claim: layer, circuit, whether composed, the features it writes there."""
    return part(request, CircuitServing).claims()


@router.post("/api/circuits/claims/release", summary="Release one circuit's claims (recovery)")
def release_claims(request: Request, circuit_id: str):
    """One circuit's claims only (there is no release-all); warnings say what was odd."""
    return part(request, CircuitServing).release(circuit_id)


@router.put("/api/circuits/active/intensity", summary="The serving circuit's persistent dial")
def active_circuit_intensity(body: Intensity, request: Request):
    """In [0, max]; 409 with no circuit or several serving. Answers `reapplied` (the value is
    live) and `superseded` (another write replaced it first)."""
    return part(request, CircuitServing).set_active_intensity(body.intensity)


@router.put("/api/circuits/{key}/intensity", summary="A circuit's persistent dial")
def circuit_intensity(key: str, body: Intensity, request: Request):
    """In [0, max], over its authored intensity; survives restarts."""
    return part(request, CircuitServing).set_intensity(key, body.intensity)


@router.post("/api/circuits/{key}/activate", summary="Make a circuit serve")
def activate_circuit(
    key: str,
    request: Request,
    body: CircuitActivation | None = None,
    allow_layer_overlap: bool = False,
):
    """Below rung 2 only with acknowledge_rung: true (its evidence is not causal). Beside active
    circuits (CIRCUIT_ALLOW_CONCURRENT) only on layers none claims, or composed onto them with
    allow_layer_overlap (query or body): 409 circuit_layer_contention otherwise."""
    overlap = allow_layer_overlap or bool(body and body.allow_layer_overlap)
    return part(request, CircuitServing).activate(
        key, bool(body and body.acknowledge_rung), overlap
    )


@router.post("/api/circuits/{key}/deactivate", summary="Take one circuit out")
def deactivate_circuit(key: str, request: Request):
    """Its claims are released; the other active circuits keep theirs and their steering."""
    return part(request, CircuitServing).deactivate(key)


def add_shared_routes(kind: str) -> None:
    """list, deactivate, get, export and delete for one kind of document."""
    plural = f"{kind}s"

    @router.get(f"/api/{plural}", summary=f"List {plural}", name=f"list_{plural}")
    def list_all(request: Request):
        return part(request, BaseManagement).list_bases(kind)

    @router.post(
        f"/api/{plural}/deactivate",
        summary=f"Deactivate the active {kind}",
        name=f"deactivate_{kind}",
    )
    def deactivate(request: Request):
        return part(request, BaseManagement).deactivate_base(kind)

    @router.get(f"/api/{plural}/{{key}}", summary=f"One {kind}", name=f"get_{kind}")
    def get_one(key: str, request: Request):
        return part(request, BaseManagement).get_base(kind, key)

    @router.get(
        f"/api/{plural}/{{key}}/export",
        summary=f"The {kind} document, byte for byte as imported",
        name=f"export_{kind}",
    )
    def export(key: str, request: Request):
        return Response(
            part(request, BaseManagement).export_base(kind, key), media_type="application/json"
        )

    @router.delete(f"/api/{plural}/{{key}}", summary=f"Delete a {kind}", name=f"delete_{kind}")
    def delete(key: str, request: Request):
        return part(request, BaseManagement).delete_base(kind, key)

    list_all.__doc__ = f"Every imported {kind}."
    deactivate.__doc__ = f"Back to the live values as the base, if a {kind} was active."
    get_one.__doc__ = f"A {kind} by id or name."
    export.__doc__ = "The raw document (unknown keys included)."
    delete.__doc__ = f"Remove a {kind}; deleting the active one deactivates it."


for _kind in bases.KINDS:
    add_shared_routes(_kind)
