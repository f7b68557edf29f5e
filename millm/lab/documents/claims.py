"""Circuits as steering bases, several at once: activation against the layers others claim, the
claims table, deactivating one circuit (its claims released, the others' kept), and what the
active circuits are. The claims are the store's (store/claims.py), checked and written under the
steering lock; a claim whose circuit is no longer active (a profile or cluster took the base, a
restart, another replica) is released before any claim is read."""

from __future__ import annotations

import logging

from millm.errors import Conflict, InvalidRequest
from millm.formats.mistudio import RUNG_LANGUAGE
from millm.kernel.steering.circuit_claims import claim_of, composed_layers
from millm.kernel.steering.live import circuit_ids
from millm.lab.documents.parts import ClaimParts
from millm.lab.documents.service import BaseManagement
from millm.store.claims import ClaimTaken, add_claims, live_claims, release_claims

log = logging.getLogger(__name__)
COMPOSED_WARNING = (
    "layers {layers} carry the sum of several circuits' steering: each circuit's effect there is "
    "no longer its own"
)


class CircuitServing:
    """Which circuits serve, and the layers each claims."""

    def __init__(self, state: ClaimParts, bases: BaseManagement):
        self.state, self.bases = state, bases

    @property
    def _active(self) -> list[str]:
        return circuit_ids(self.state.steering.active)

    def reconcile(self) -> list[dict]:
        """Release claims of circuits no longer active; the live claims (call under the lock)."""
        active = set(self._active)
        live = live_claims(self.state.store)
        stale = sorted({row["circuit_id"] for row in live} - active)
        if stale:
            release_claims(self.state.store, stale)
            live = [row for row in live if row["circuit_id"] not in stale]
        return live

    def demote_past_the_flag(self) -> None:
        """At start: with CIRCUIT_ALLOW_CONCURRENT off, only the most recently activated circuit
        stays active (logged circuit_demoted_by_flag for the others)."""
        with self.state.steering.lock:
            active = self._active
            if len(active) > 1 and not self.state.settings.circuit_allow_concurrent:
                for demoted in active[:-1]:
                    log.warning(
                        "circuit_demoted_by_flag: %s (CIRCUIT_ALLOW_CONCURRENT is off)", demoted
                    )
                self.state.steering.set_circuits(active[-1:])
            self.reconcile()

    # activation -----------------------------------------------------------------------------------
    def activate(self, key: str, acknowledge_rung: bool, allow_overlap: bool = False) -> dict:
        """Make a circuit serve: below rung 2 only when acknowledged; beside the active ones only
        with CIRCUIT_ALLOW_CONCURRENT, on layers none holds (or composed onto them with
        `allow_overlap`); nothing changes on a refusal."""
        with self.state.steering.lock:
            row = self.state.circuits.find(key)
            document = self.state.circuits.document(row)
            level = self.state.circuits.rung(document)
            if level < 2 and not acknowledge_rung:
                raise InvalidRequest(
                    f"circuit {row['name']!r} is at rung {level} ({RUNG_LANGUAGE[level]}): its "
                    "edges are not causally validated; "
                    'send {"acknowledge_rung": true} to activate it anyway',
                    param="acknowledge_rung",
                    code="rung_not_acknowledged",
                )
            # a circuit none of whose layers binds would refuse every request
            self.state.planner.check_fits("circuit", row["id"])
            live = self.reconcile()
            active = self._active
            if row["id"] in active:
                return self._activated(row, live, allow_overlap)
            if active and not self.state.settings.circuit_allow_concurrent:
                holding = ", ".join(repr(self.state.circuits.find(i)["name"]) for i in active)
                raise Conflict(
                    f"circuit {holding} is active and CIRCUIT_ALLOW_CONCURRENT is off (this "
                    "server's configuration): deactivate it first, or start the server with "
                    "CIRCUIT_ALLOW_CONCURRENT=true to serve circuits on disjoint layers together",
                    param="allow_layer_overlap",
                    code="circuit_concurrency_disabled",
                )
            claim = claim_of(document, self.state.steering.attached)
            names = {
                i: self.state.circuits.find(i)["name"] for i in {r["circuit_id"] for r in live}
            }
            modes = {
                i: claim_of(self.state.circuits.document(self.state.circuits.find(i)),
                            self.state.steering.attached).mode
                for i in active
            }  # fmt: skip
            requested = {"id": row["id"], "name": row["name"]}
            composed = composed_layers(requested, claim, live, names, modes, allow_overlap)
            layers = {layer: (layer in composed, keys) for layer, keys in claim.layers.items()}
            try:
                add_claims(self.state.store, row["id"], layers)
            except ClaimTaken:
                raise Conflict(
                    f"another writer claimed a layer circuit {row['name']!r} needs while it was "
                    "being activated; nothing was changed: look again (GET /api/circuits/claims)",
                    param="allow_layer_overlap",
                    code="circuit_layer_contention",
                ) from None
            try:
                previous = self.state.steering.active
                self.state.steering.set_circuits([*active, row["id"]])
            except Exception:
                release_claims(self.state.store, [row["id"]])
                raise
            if previous is not None and previous.get("kind") in ("profile", "cluster"):
                log.warning(
                    "circuit %s replaced the active %s as the base", row["name"], previous["kind"]
                )
            if composed:
                log.warning(
                    "circuit %s composed onto layers %s held by %s",
                    row["name"], sorted(composed), sorted(names.values()),
                )  # fmt: skip
            return self._activated(row, self.reconcile(), allow_overlap)

    def _activated(self, row: dict, live: list[dict], allow_overlap: bool) -> dict:
        view = self.bases.circuit_view(row)
        mine = [r for r in live if r["circuit_id"] == row["id"]]
        composed = sorted(r["layer"] for r in mine if r["composed"] or _shared(r, live))
        answer = {
            **view,
            "claimed_layers": sorted(r["layer"] for r in mine),
            "composed_layers": composed,
        }
        if allow_overlap:
            answer["allowed_layer_overlap"] = True
        if composed:
            answer["warning"] = COMPOSED_WARNING.format(layers=composed)
        return answer

    # the dial -------------------------------------------------------------------------------------
    def set_intensity(self, key: str, intensity: float) -> dict:
        """A circuit's persistent dial within [0, max] (over its authored intensity): live for
        every request admitted after it while the circuit serves."""
        with self.state.steering.lock:
            row = self.state.circuits.set_intensity(key, intensity)
            if row["id"] in self._active:
                self.state.steering.bump()
            return self.bases.circuit_view(row)

    def set_active_intensity(self, intensity: float) -> dict:
        """The serving circuit's dial (PUT /api/circuits/active/intensity): 409 with none or
        several serving. `reapplied`: the value is what requests admitted from now on are steered
        at; `superseded`: another write replaced it before this answer (never, here: a request's
        own dial or steering never undoes a write, and this one is made under the lock)."""
        with self.state.steering.lock:
            active = self._active
            if not active:
                raise Conflict(
                    "no circuit is active: activate one, or set a circuit's dial by id "
                    "(PUT /api/circuits/{id}/intensity)",
                    param="intensity",
                    code="no_active_circuit",
                )
            if len(active) > 1:
                names = [self.state.circuits.find(i)["name"] for i in active]
                raise AmbiguousActiveCircuit(
                    f"{len(active)} circuits are active ({', '.join(names)}): set one's dial by id "
                    "(PUT /api/circuits/{id}/intensity)",
                    [{"id": i, "name": n} for i, n in zip(active, names, strict=True)],
                )
            view = self.set_intensity(active[0], intensity)
            stored = self.state.circuits.find(active[0]).get("intensity")
            live = self.state.steering.enabled
            answer = {
                **view,
                "reapplied": live and stored == float(intensity),
                "superseded": stored != float(intensity),
            }
            if not live:
                answer["warning"] = "steering is disabled: the dial applies once it is enabled"
            return answer

    # deactivation ---------------------------------------------------------------------------------
    def deactivate(self, key: str | None) -> dict:
        """One circuit back out (its claims released, the others' kept), or every circuit (None)."""
        with self.state.steering.lock:
            active = self._active
            if key is None:
                gone = active
            else:
                row = self.state.circuits.find(key)
                gone = [row["id"]] if row["id"] in active else []
            left = [i for i in active if i not in gone]
            if gone:
                self.state.steering.set_circuits(left)
            released = release_claims(self.state.store, gone)
            live = self.reconcile()
            return {
                "deactivated": gone[0] if len(gone) == 1 else (gone or None),
                "released_layers": released,
                "still_claimed_layers": sorted({r["layer"] for r in live}),
            }

    # reading --------------------------------------------------------------------------------------
    def claims(self) -> dict:
        """Every live claim: layer, circuit, whether composed, the features it writes there."""
        with self.state.steering.lock:
            live = self.reconcile()
        return {
            "object": "list",
            "data": [
                {
                    "layer": r["layer"],
                    "circuit_id": r["circuit_id"],
                    "circuit_name": self.state.circuits.find(r["circuit_id"])["name"],
                    "composed": r["composed"] or _shared(r, live),
                    "steering_keys": r["steering_keys"],
                    "claimed_at": r["claimed_at"],
                }
                for r in live
            ],
        }

    def release(self, key: str) -> dict:
        """Recovery: release one circuit's claims (warnings say when the id is unknown, when it
        held none, and when it is still active)."""
        warnings = []
        with self.state.steering.lock:
            ids = [r["id"] for r in self.state.circuits.all() if key in (r["id"], r["name"])]
            circuit_id = ids[0] if ids else key
            if not ids:
                warnings.append(
                    f"no circuit has the id or name {key!r}; its claims are released anyway"
                )
            if circuit_id in self._active:
                warnings.append(
                    "the circuit is still active: its claims are released, and taken again at its "
                    "next activation; deactivate it to stop its steering"
                )
            released = release_claims(self.state.store, [circuit_id])
            if not released:
                warnings.append("it held no claim")
        return {"circuit_id": circuit_id, "released_layers": released, "warnings": warnings}

    def active(self, single: bool = False) -> dict | list:
        """The active circuits, each with its claimed and composed layers, serving mode and
        whether it steers; `single`: the first in the shape of one active circuit."""
        with self.state.steering.lock:
            live = self.reconcile()
            rows = [self.state.circuits.find(i) for i in self._active]
            if single:
                row = rows[0] if rows else None
                return {
                    "circuit": self.bases.circuit_view(row) if row else None,
                    "steering": self.bases.steering_status(row),
                }
            entries = []
            for row in rows:
                view = self.bases.circuit_view(row)
                mine = [r for r in live if r["circuit_id"] == row["id"]]
                status = view["steering"]
                entries.append(
                    {
                        **view,
                        "claimed_layers": sorted(r["layer"] for r in mine),
                        "composed_layers": sorted(
                            r["layer"] for r in mine if r["composed"] or _shared(r, live)
                        ),
                        "serving_mode": status["mode"],
                    }
                )
            return entries


class AmbiguousActiveCircuit(Conflict):
    """409 ambiguous_active_circuit: several circuits serve, so "the active one" names none."""

    def __init__(self, message: str, active: list[dict]):
        super().__init__(message, param="intensity", code="ambiguous_active_circuit")
        self.active = active

    def to_dict(self) -> dict:
        """OpenAI's four fields plus `details.active_circuits`."""
        return {**super().to_dict(), "details": {"active_circuits": self.active}}


def _shared(claim: dict, live: list[dict]) -> bool:
    """Whether another live claim is on the same layer (the incumbent of a composed layer)."""
    return any(
        r["layer"] == claim["layer"] and r["circuit_id"] != claim["circuit_id"] for r in live
    )
