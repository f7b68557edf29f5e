"""/api/sensing (a cluster's co-activations) and /api/circuit-sensing (a circuit's edges): each
base's switch and config, the status, the events, and one live feed of both."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from millm.kernel.sensing.sensing import Sensing
from millm.lab.sensing.protocol import CircuitSensingConfig, ClusterSensingConfig
from millm.lab.sensing.service import SensingManagement
from millm.v1.http.deps import part
from millm.v1.http.feeds import feed_response
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)
Limit = Annotated[int, Query(ge=1, le=500)]


def _service(request: Request) -> SensingManagement:
    return part(request, SensingManagement)


# clusters -----------------------------------------------------------------------------------------
@router.get("/api/sensing/status", summary="Cluster sensing: what is armed, counters, retention")
def cluster_status(request: Request):
    """The active cluster's sensing (members, sensable ones, quorum, threshold mode), the
    counters since the start, and every cluster whose sensing is on."""
    return _service(request).status("cluster")


@router.get("/api/sensing/events", summary="Cluster sensing events, newest first")
def cluster_events(
    request: Request,
    cluster_id: str | None = None,
    profile_id: str | None = None,
    limit: Limit = 50,
    since: float | None = None,
):
    """Events (of one cluster, by id or name; `profile_id` is the original miLLM's name for it),
    newest first, those after `since` (a time in seconds), with the total that match."""
    return _service(request).events("cluster", cluster_id or profile_id, limit, since)


@router.get("/api/sensing/events/{event_id}", summary="One cluster sensing event")
def cluster_event(event_id: str, request: Request):
    """The event, with its context (404 sensing_event_not_found)."""
    return _service(request).event("cluster", event_id)


@router.delete("/api/sensing/events", summary="Delete cluster sensing events")
def forget_cluster_events(
    request: Request, cluster_id: str | None = None, profile_id: str | None = None
):
    """Every cluster's events, or one cluster's."""
    return _service(request).forget("cluster", cluster_id or profile_id)


@router.get("/api/sensing/feed", summary="Live feed of sensing events (server-sent events)")
async def feed(request: Request):
    """Each new event of either kind as one SSE frame, without its context."""
    return feed_response(request, part(request, Sensing).feed, "sensing feed")


@router.post("/api/sensing/{cluster_id}/enable", summary="Sense a cluster while it is active")
def enable_cluster(cluster_id: str, request: Request):
    """Switch a cluster's sensing on (400 when it is active and cannot be sensed)."""
    return _service(request).switch("cluster", cluster_id, True)


@router.post("/api/sensing/{cluster_id}/disable", summary="Stop sensing a cluster")
def disable_cluster(cluster_id: str, request: Request):
    """Switch a cluster's sensing off; its events are kept."""
    return _service(request).switch("cluster", cluster_id, False)


@router.put("/api/sensing/{cluster_id}/config", summary="A cluster's sensing settings")
def configure_cluster(cluster_id: str, body: ClusterSensingConfig, request: Request):
    """min_k (1 to the sensable members; null: all of them), context_tokens, epsilon,
    theta_floor; it re-arms at once."""
    return _service(request).configure("cluster", cluster_id, body.model_dump(exclude_unset=True))


# circuits -----------------------------------------------------------------------------------------
@router.get("/api/circuit-sensing/status", summary="Edge sensing: what is armed, counters")
def circuit_status(request: Request):
    """The active circuit's sensed and unsensable edges (with why), the lag allowed, the layers
    that dropped events in the last row, the counters, and every circuit whose sensing is on."""
    return _service(request).status("circuit")


@router.get("/api/circuit-sensing/events", summary="Edge sensing events, newest first")
def circuit_events(
    request: Request,
    circuit_id: str | None = None,
    edge_key: str | None = None,
    limit: Limit = 50,
    since: float | None = None,
):
    """Edge observations (of one circuit, of one edge `{up}@{layer}->{down}@{layer}`), newest
    first, with the total that match."""
    return _service(request).events("circuit", circuit_id, limit, since, edge_key)


@router.get("/api/circuit-sensing/events/{event_id}", summary="One edge sensing event")
def circuit_event(event_id: str, request: Request):
    """The observation, with its context (404 circuit_sensing_event_not_found)."""
    return _service(request).event("circuit", event_id)


@router.delete("/api/circuit-sensing/events", summary="Delete one circuit's edge events")
def forget_circuit_events(request: Request, circuit_id: str):
    """One circuit's observations (the circuit is required)."""
    return _service(request).forget("circuit", circuit_id)


@router.post("/api/circuit-sensing/{circuit_id}/enable", summary="Sense a circuit's edges")
def enable_circuit(circuit_id: str, request: Request):
    """Switch a circuit's edge sensing on (armed while it is active)."""
    return _service(request).switch("circuit", circuit_id, True)


@router.post("/api/circuit-sensing/{circuit_id}/disable", summary="Stop sensing a circuit")
def disable_circuit(circuit_id: str, request: Request):
    """Switch a circuit's edge sensing off; its events are kept."""
    return _service(request).switch("circuit", circuit_id, False)


@router.put("/api/circuit-sensing/{circuit_id}/config", summary="A circuit's sensing settings")
def configure_circuit(circuit_id: str, body: CircuitSensingConfig, request: Request):
    """max_token_lag (1-64), context_tokens, epsilon, theta_floor; it re-arms at once."""
    return _service(request).configure("circuit", circuit_id, body.model_dump(exclude_unset=True))
