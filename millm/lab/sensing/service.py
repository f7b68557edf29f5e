"""Sensing as the API presents and changes it: a cluster's or a circuit's switch and config
(checked against the attached SAEs where it can be), each kind's status, and its events."""

from __future__ import annotations

from millm.errors import InvalidRequest, MillmError, NotFound
from millm.kernel.sensing.arming import CircuitArm, ClusterArm
from millm.kernel.sensing.sensing import OVERHEAD_WARN_MS, check_min_k
from millm.kernel.steering.live import circuit_ids
from millm.lab.sensing.parts import SensingParts
from millm.store.sensing import delete_events, list_events, one_event, prune_events

NOT_FOUND = {"cluster": "sensing_event_not_found", "circuit": "circuit_sensing_event_not_found"}


class SensingManagement:
    """Sensing's switches, status and events, for both kinds (`cluster`, `circuit`)."""

    def __init__(self, state: SensingParts):
        self.state = state

    @property
    def sensing(self):
        """The kernel's sensing."""
        return self.state.sensing

    # switches -------------------------------------------------------------------------------------
    def switch(self, kind: str, key: str, enabled: bool) -> dict:
        """Turn a base's sensing on or off (on: refused with a 400 when it is the active cluster
        and cannot be sensed, so nothing changes); events are kept either way."""
        row = self._row(kind, key)
        _, config = self.sensing.switch(kind, row["id"])
        if enabled and self._is_active(kind, row["id"]):
            self._checked_arm(kind, row["id"])
        self.sensing.set_switch(kind, row["id"], enabled, config)
        return self._switched(kind, row)

    def configure(self, kind: str, key: str, changes: dict) -> dict:
        """Change a base's config (left out: kept; null: the default), checked before stored."""
        row = self._row(kind, key)
        enabled, config = self.sensing.switch(kind, row["id"])
        merged = {k: v for k, v in {**config, **changes}.items() if v is not None}
        self.sensing.set_switch(kind, row["id"], enabled, merged)
        try:
            arm = self._checked_arm(kind, row["id"])
            if isinstance(arm, ClusterArm):
                check_min_k(arm, merged.get("min_k"))
        except MillmError:
            self.sensing.set_switch(kind, row["id"], enabled, config)  # as it was
            raise
        return {**self._switched(kind, row), "config": merged}

    def _checked_arm(self, kind: str, base_id: str):
        """The base armed now; a cluster whose layer is not attached is accepted unchecked."""
        try:
            return self.sensing.arm(kind, base_id)
        except InvalidRequest as exc:
            if kind == "cluster" and "does not bind" in exc.message:
                return None
            raise

    def _switched(self, kind: str, row: dict) -> dict:
        enabled, _ = self.sensing.switch(kind, row["id"])
        arms, _ = self.sensing.armed()
        key = "profile_id" if kind == "cluster" else "circuit_id"
        return {
            key: row["id"],
            "name": row["name"],
            "sensing_enabled": enabled,
            "armed": any(arm.base_id == row["id"] for arm in arms),
        }

    def _row(self, kind: str, key: str) -> dict:
        now = self.state.planner.now()
        if kind == "cluster":
            return self.state.planner.clusters.find_in(now.clusters, key)
        return self.state.planner.circuits.find_in(now.circuits, key)

    def _is_active(self, kind: str, base_id: str) -> bool:
        active = self.state.planner.now().active
        if kind == "circuit":
            return base_id in circuit_ids(active)
        return active is not None and active == {"kind": kind, "id": base_id}

    # status ---------------------------------------------------------------------------------------
    def status(self, kind: str) -> dict:
        """What is sensed now, the counters since the start, retention, and the bases whose
        sensing is on."""
        arms, problem = self.sensing.armed()
        armed = [arm for arm in arms if _kind(arm) == kind]
        mine = armed[0] if armed else None
        counters = self.sensing.counters[kind]
        now = self.state.planner.now()
        shelf = now.clusters if kind == "cluster" else now.circuits
        active = now.active or {}
        enabled = []
        for base_id in self.sensing.enabled(kind):
            row = shelf.get(base_id)
            if row is not None:  # a base deleted since takes its switch with it
                enabled.append(
                    {"id": base_id, "name": row["name"], "is_active": active.get("id") == base_id}
                )
        settings = self.state.settings
        common = {
            "armed": mine is not None,
            "not_armed_reason": problem if mine is None and active.get("kind") == kind else None,
            "last_request_overhead_ms": counters.last_overhead_ms,
            "overhead_warn_threshold_ms": OVERHEAD_WARN_MS,
            "events_recorded_since_start": counters.events_recorded,
            "requests_sensed": counters.requests_sensed,
            "requests_truncated": counters.requests_truncated,
            "feed_dropped": self.sensing.feed.dropped,
            "rows_dropped": self.sensing.dropped_rows,
            "retention": {
                "max_events": settings.sensing_max_events_kept,
                "max_age_days": settings.sensing_max_age_days,
            },
        }
        if kind == "cluster":
            assert mine is None or isinstance(mine, ClusterArm)
            return {
                **common,
                "profile_id": mine.base_id if mine else None,
                "profile_name": mine.name if mine else None,
                "layer": mine.read.layer if mine else None,
                "member_count": len(mine.thetas) if mine else None,
                "sensable_count": mine.sensable if mine else None,
                "min_k": mine.min_k if mine else None,
                "threshold_mode": mine.mode if mine else None,
                "context_tokens": mine.context_tokens if mine else settings.sensing_context_tokens,
                "enabled_clusters": enabled,
            }
        circuits = [arm for arm in armed if isinstance(arm, CircuitArm)]
        return {
            **common,
            "circuit_id": mine.base_id if mine else None,
            "circuit_name": mine.name if mine else None,
            "armed_circuits": [
                {
                    "id": arm.base_id,
                    "name": arm.name,
                    "sensable_edges": [e.key for e in arm.edges],
                    "truncated_layers": counters.truncated_by_circuit.get(arm.base_id, []),
                }
                for arm in circuits
            ],
            "layers": sorted({r.layer for arm in circuits for r in arm.reads}),
            "sensable_edges": [e.key for arm in circuits for e in arm.edges],
            "unsensable_edges": [
                {**edge, "circuit_id": arm.base_id} for arm in circuits for edge in arm.unsensable
            ],
            "max_token_lag": (
                mine.max_token_lag
                if isinstance(mine, CircuitArm)
                else settings.circuit_sensing_max_token_lag
            ),
            "context_tokens": mine.context_tokens if mine else settings.sensing_context_tokens,
            "truncated_layers": sorted(
                {layer for shed in counters.truncated_by_circuit.values() for layer in shed}
            ),
            "enabled_circuits": enabled,
        }

    # events ---------------------------------------------------------------------------------------
    def events(
        self,
        kind: str,
        base: str | None,
        limit: int,
        since: float | None,
        edge_key: str | None = None,
    ) -> dict:
        """Events newest first (of one base, after `since`, of one edge), and how many match."""
        self.sensing.flush(2.0)  # what finished rows are still recording
        prune_events(self.state.store, kind, self.state.settings.sensing_max_age_days * 86400)
        base_id = self._row(kind, base)["id"] if base is not None else None
        found, total = list_events(self.state.store, kind, base_id, limit, since, edge_key)
        return {"object": "list", "data": found, "total": total}

    def event(self, kind: str, event_id: str) -> dict:
        """One event (404 naming it)."""
        self.sensing.flush(2.0)
        found = one_event(self.state.store, kind, event_id)
        if found is None:
            raise NotFound(f"no {kind} sensing event has the id {event_id!r}", code=NOT_FOUND[kind])
        return found

    def forget(self, kind: str, base: str | None) -> dict:
        """Delete events (of one base)."""
        base_id = self._row(kind, base)["id"] if base is not None else None
        return {"deleted": delete_events(self.state.store, kind, base_id)}


def _kind(arm) -> str | None:
    if isinstance(arm, ClusterArm):
        return "cluster"
    return "circuit" if isinstance(arm, CircuitArm) else None
