"""/api/clusters and /api/circuits: import miStudio documents, export them raw, make one the steering base."""

from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from millm.errors import InvalidRequest
from millm.interp.binding import cluster_binding
from millm.interp.mistudio import RUNG_LANGUAGE, authored_intensity, declared_range
from millm.service.plans import circuit_status
from millm.service.state import ServerState

router = APIRouter()


class Intensity(BaseModel):
    """A cluster's persistent dial, within [0, max]."""

    model_config = ConfigDict(strict=True, extra="forbid")
    intensity: float


class CircuitActivation(BaseModel):
    """Activating a circuit below rung 2 needs an explicit acknowledgement."""

    model_config = ConfigDict(strict=True, extra="forbid")
    acknowledge_rung: bool = False


def state_of(request: Request) -> ServerState:
    """The server state behind this app."""
    return request.app.state.millm


def is_active(state: ServerState, kind: str, base_id: str) -> bool:
    """Whether this cluster/circuit is the global steering base."""
    return state.steering.active == {"kind": kind, "id": base_id}


# clusters ------------------------------------------------------------------------------------------
def cluster_view(state: ServerState, row: dict) -> dict:
    """A cluster: name, members, declared range, persistent dial, whether active."""
    document = state.clusters.document(row)
    sae = document.get("sae") or {}
    return {
        "id": row["id"],
        "name": row["name"],
        "active": is_active(state, "cluster", row["id"]),
        "intensity": row["intensity"],
        "intensity_range": list(declared_range(document)) if declared_range(document) else None,
        "authored_intensity": authored_intensity(document),
        "sae": {"layer": sae.get("layer"), "n_features": sae.get("n_features"), "mistudio_sae_id": sae.get("mistudio_sae_id") or sae.get("sae_id")},
        "members": [
            {"feature_idx": m["feature_idx"], "strength": m["strength"], "sign": m.get("sign", 1), "label": m.get("label")}
            for m in document["members"]
        ],
        "created_at": row["created_at"],
    }


@router.post("/api/clusters/import", summary="Import a cluster definition or bundle", status_code=201)
async def import_clusters(request: Request, on_conflict: Literal["rename", "fail"] = "rename", activate: bool = False):
    """Validated whole (1 MB cap); `activate` makes the (first) imported cluster the steering base."""
    state = state_of(request)
    # An import that is to be activated must bind first: a refused activation stores nothing either.
    check = (lambda definitions: cluster_binding(definitions[0], state.steering.attached)) if activate else None
    rows = state.clusters.import_raw(await request.body(), on_conflict, check)
    result = {"object": "list", "data": [cluster_view(state, row) for row in rows]}
    if activate:
        result["activation"] = activate_cluster_row(state, rows[0])
        result["data"] = [cluster_view(state, row) for row in rows]
    return result


@router.get("/api/clusters", summary="List clusters")
async def list_clusters(request: Request):
    """Every imported cluster."""
    state = state_of(request)
    return {"object": "list", "data": [cluster_view(state, row) for row in state.clusters.all()]}


@router.post("/api/clusters/deactivate", summary="Deactivate the active cluster")
async def deactivate_cluster(request: Request):
    """Back to the live values as the base, if a cluster was active."""
    return {"deactivated": state_of(request).steering.deactivate("cluster")}


@router.get("/api/clusters/{key}", summary="One cluster")
async def get_cluster(key: str, request: Request):
    """A cluster by id or name."""
    state = state_of(request)
    return cluster_view(state, state.clusters.find(key))


@router.get("/api/clusters/{key}/export", summary="The cluster document, byte for byte as imported")
async def export_cluster(key: str, request: Request):
    """The raw document (unknown keys included)."""
    row = state_of(request).clusters.find(key)
    return Response(row["raw"], media_type="application/json")


@router.delete("/api/clusters/{key}", summary="Delete a cluster")
async def delete_cluster(key: str, request: Request):
    """Remove a cluster; deleting the active one deactivates it."""
    state = state_of(request)
    row = state.clusters.find(key)
    if is_active(state, "cluster", row["id"]):
        state.steering.set_active(None, None)
    state.clusters.delete(row["id"])
    return {"id": row["id"], "name": row["name"], "deleted": True}


@router.put("/api/clusters/{key}/intensity", summary="Set a cluster's persistent dial")
async def set_cluster_intensity(key: str, body: Intensity, request: Request):
    """Bounds [0, max]; survives restarts."""
    state = state_of(request)
    row = state.clusters.set_intensity(key, body.intensity)
    if is_active(state, "cluster", row["id"]):
        state.steering.bump()
    return cluster_view(state, row)


def activate_cluster_row(state: ServerState, row: dict) -> dict:
    """Check the cluster against the attached SAE (400 with the figures), then make it the base."""
    binding = cluster_binding(state.clusters.document(row), state.steering.attached)
    state.steering.set_active("cluster", row["id"])
    return {"binding": binding.to_dict(), "live": state.steering.enabled}


@router.post("/api/clusters/{key}/activate", summary="Make a cluster the steering base")
async def activate_cluster(key: str, request: Request):
    """n_features against the SAE's width and the layer are checked first."""
    state = state_of(request)
    row = state.clusters.find(key)
    activation = activate_cluster_row(state, row)
    return {**cluster_view(state, row), **activation}


# circuits --------------------------------------------------------------------------------------------
def steering_status(state: ServerState, row: dict | None) -> dict:
    """Whether and how a circuit is steering now: mode, bindings, rung and its language."""
    if row is None:
        return {"steering": False, "mode": "none", "reason": "no active circuit"}
    try:
        document = state.circuits.document(row)
        status = circuit_status(document, state.steering)
    except (json.JSONDecodeError, KeyError, TypeError):
        return {"steering": False, "mode": "none", "reason": "the stored definition cannot be parsed"}
    active = is_active(state, "circuit", row["id"])
    steering = active and state.steering.enabled and status.mode != "none"
    reason = (
        "not the active circuit" if not active
        else "steering is disabled" if not state.steering.enabled
        else "no SAE is attached on any member layer" if status.mode == "none"
        else "served by its bound layers as a cluster (slice_fallback)" if status.mode == "slice_fallback"
        else "every member layer is bound"
    )
    view = {
        "steering": steering,
        "mode": status.mode,
        "reason": reason,
        "bindings": [b.to_dict() for b in status.bindings.values()],
        "rung": status.rung,
        "language": RUNG_LANGUAGE[status.rung],
    }
    # The rung header (and its language) is promised only while a circuit genuinely steers in full.
    view["rung_header"] = steering and status.mode == "full"
    return view


def circuit_view(state: ServerState, row: dict) -> dict:
    """A circuit's summary and how it would bind now."""
    document = state.circuits.document(row)
    status = steering_status(state, row)
    return {
        "id": row["id"],
        "name": row["name"],
        "active": is_active(state, "circuit", row["id"]),
        "rung": status.get("rung"),
        "language": status.get("language"),
        "layers": sorted({ref["layer"] for ref in document["saes"]}),
        "members": len(document["members"]),
        "edges": len(document.get("edges") or []),
        "intensity_range": list(declared_range(document)) if declared_range(document) else None,
        "authored_intensity": authored_intensity(document),
        "steering": status,
        "created_at": row["created_at"],
    }


@router.post("/api/circuits/import", summary="Import a circuit definition", status_code=201)
async def import_circuit(request: Request, on_conflict: Literal["rename", "fail"] = "rename"):
    """Validated whole (1 MB cap); stored byte for byte."""
    state = state_of(request)
    return circuit_view(state, state.circuits.import_raw(await request.body(), on_conflict))


@router.get("/api/circuits", summary="List circuits")
async def list_circuits(request: Request):
    """Every imported circuit."""
    state = state_of(request)
    return {"object": "list", "data": [circuit_view(state, row) for row in state.circuits.all()]}


@router.get("/api/circuits/active", summary="The active circuit and whether it steers now")
async def active_circuit(request: Request):
    """`steering` says whether and how it steers: read it (not the row) before describing evidence."""
    state = state_of(request)
    active = state.steering.active
    row = state.circuits.find(active["id"]) if active and active["kind"] == "circuit" else None
    return {"circuit": circuit_view(state, row) if row else None, "steering": steering_status(state, row)}


@router.post("/api/circuits/deactivate", summary="Deactivate the active circuit")
async def deactivate_circuit(request: Request):
    """Back to the live values as the base, if a circuit was active."""
    return {"deactivated": state_of(request).steering.deactivate("circuit")}


@router.get("/api/circuits/{key}", summary="One circuit")
async def get_circuit(key: str, request: Request):
    """A circuit by id or name."""
    state = state_of(request)
    return circuit_view(state, state.circuits.find(key))


@router.get("/api/circuits/{key}/export", summary="The circuit document, byte for byte as imported")
async def export_circuit(key: str, request: Request):
    """The raw document (unknown keys included)."""
    return Response(state_of(request).circuits.find(key)["raw"], media_type="application/json")


@router.delete("/api/circuits/{key}", summary="Delete a circuit")
async def delete_circuit(key: str, request: Request):
    """Remove a circuit; deleting the active one deactivates it."""
    state = state_of(request)
    row = state.circuits.find(key)
    if is_active(state, "circuit", row["id"]):
        state.steering.set_active(None, None)
    state.circuits.delete(row["id"])
    return {"id": row["id"], "name": row["name"], "deleted": True}


@router.post("/api/circuits/{key}/activate", summary="Make a circuit the steering base")
async def activate_circuit(key: str, request: Request, body: CircuitActivation | None = None):
    """Below rung 2 only with acknowledge_rung: true (its evidence is not causal)."""
    state = state_of(request)
    row = state.circuits.find(key)
    level = state.circuits.rung(state.circuits.document(row))
    if level < 2 and not (body and body.acknowledge_rung):
        raise InvalidRequest(
            f"circuit {row['name']!r} is at rung {level} ({RUNG_LANGUAGE[level]}): its edges are not causally validated; "
            "send {\"acknowledge_rung\": true} to activate it anyway",
            param="acknowledge_rung",
            code="rung_not_acknowledged",
        )
    state.planner.check_fits("circuit", row["id"])  # a circuit none of whose layers binds would refuse every request
    state.steering.set_active("circuit", row["id"])
    return circuit_view(state, row)
