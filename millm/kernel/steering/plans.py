"""A request's steering plan: its base (own profile, active profile/cluster/circuit, live values)
through the intensity dial, resolved once at admission into an immutable Plan.

The base is the request's `profile` if given, else the active profile, cluster or circuit,
else the live values (when steering is enabled). `steering_intensity` 0 / "off" turns steering
off for the request without looking at the base. Profiles and live values declare no range,
so they follow the cluster rule with the defaults; clusters the cluster rule; circuits in full
the circuit rule, and in slice_fallback the cluster rule (0.5 floor included).

An active base that no longer fits the attached SAEs (one detached or replaced, an index past
the width, a circuit none of whose layers binds) refuses the request with 400
invalid_feature_index naming the base and the entry; it is never served unsteered, or with some
entries left out, as if it were steered. A circuit with only some layers bound is the spec's
slice_fallback, which its X-miLLM-Steering header names.

Planning reads memory only: the steering state is snapshotted under its lock (nothing else is
done while it is held) and profiles, clusters and circuits come from the books' shelves. A plan
is resolved once per state and reused from a small cache while nothing it depends on changes:
the key holds the steering version, the steering's in-memory change count and each book's
revision, so any change, through whichever route, makes the next request resolve afresh.
Refusals are never cached: an active base that no longer fits refuses every request (and is
logged once per state, so the operator sees why requests fail).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace

from millm.errors import InvalidRequest, MillmError, describe
from millm.interp.intensity import Dial, cluster_lambda
from millm.interp.steering import InvalidFeatureIndex, feature_edit
from millm.interp.steering_hash import applied_sets, scaled_ops
from millm.kernel.books.base import Shelf
from millm.kernel.books.documents import CircuitBook, ClusterBook, stored_document
from millm.kernel.steering.base_fit import BaseUnfit, DialLimits
from millm.kernel.steering.document_plans import circuit_plan, circuits_plan, cluster_plan
from millm.kernel.steering.live import Steering, circuit_ids, profile_edit
from millm.kernel.steering.plan import NO_STEERING, Plan, turned_off, unsteered
from millm.kernel.steering.plan_cache import PlanCache, Snapshot, epoch_of, state_stamp
from millm.kernel.steering.resolution import Refusals, resolve_spec

log = logging.getLogger(__name__)


class Planner:
    """Resolves plans from the steering state and the imported documents."""

    def __init__(
        self, steering: Steering, clusters: ClusterBook, circuits: CircuitBook, limits: DialLimits
    ):
        self.steering, self.clusters, self.circuits, self.limits = (
            steering,
            clusters,
            circuits,
            limits,
        )
        self.plans = PlanCache()
        self._logged: dict[str, tuple] = {}  # topic -> the state stamp it was last logged in

    def plan_for(self, profile: str | None, dial: Dial | None, *, promised: bool = False) -> Plan:
        """The immutable plan of one request, from memory: resolved once per state, then reused.

        `promised`: the profile is a name's promise (a steered variant's), so with no SAE attached
        it is refused (400 profile_not_applicable) where a request's own profile runs unsteered,
        as the API page says of a request's `profile`."""
        return self._cached(
            (profile, dial, promised),
            lambda now: self._refusing_unfit(now, profile, dial, promised),
        )

    def plan_for_base(self, kind: str, key: str, dial: Dial | None) -> Plan:
        """A profile, cluster or circuit (by name or id) steering one request only, whatever the
        active base and the enabled flag, through the dial (None: a cluster's stored intensity, a
        circuit's authored one); 404 for an unknown one, 400 when it does not fit the attached
        SAEs."""
        if kind == "profile":
            return self.plan_for(key, dial)
        return self._cached((kind, key, dial), lambda now: self._request_base(now, kind, key, dial))

    def plan_for_spec(self, spec: dict, dial: Dial | None) -> Plan:
        """A request's own `steering` (a valid, canonical spec) steering it alone, through the dial,
        whatever the active base and the enabled flag; 400 naming the entry when it does not fit."""
        key = json.dumps(spec, sort_keys=True)  # the spec is the key: equal requests share one plan
        return self._cached(("spec", key, dial), lambda now: self._spec(now, spec, dial))

    def _cached(self, key: tuple, resolve: Callable[[Snapshot], Plan]) -> Plan:
        """The plan kept for `key` in the current state, else `resolve`d from a snapshot and kept;
        marked `unsynced` while this replica is out of step with the shared store."""
        with self.steering.lock:  # held only to read one consistent state
            stamp, shelves = self._stamp()
            plan = self.plans.get((stamp, *key))
            if plan is None:
                now = self._snapshot(stamp, shelves)
        if plan is None:
            plan = replace(resolve(now), epoch=epoch_of(stamp))
            self.plans.put((stamp, *key), plan)
        in_step, _ = self.steering.replica.in_step()
        return plan if in_step else replace(plan, params=(*plan.params, ("unsynced", True)))

    def moved(self, plan: Plan) -> bool:
        """Whether the steering state moved since `plan` was resolved (an operator's write while
        its request ran: X-miLLM-Steering's `changed`)."""
        if plan.epoch is None:
            return False
        with self.steering.lock:
            return epoch_of(self._stamp()[0]) != plan.epoch

    def _refusing_unfit(
        self, now: Snapshot, profile: str | None, dial: Dial | None, promised: bool
    ) -> Plan:
        try:
            return self._resolve(now, profile, dial, promised)
        except BaseUnfit as exc:  # refused each time, never cached; logged once per state
            if self._first_time("unfit", now.stamp):
                log.warning("refusing steered requests: %s", exc.message)
            raise

    def _request_base(self, now: Snapshot, kind: str, key: str, dial: Dial | None) -> Plan:
        try:
            return (
                self._cluster(now, key, dial)
                if kind == "cluster"
                else self._circuit(now, key, dial)
            )
        except (
            ValueError,
            KeyError,
            TypeError,
        ) as exc:  # a stored definition that no longer parses
            raise InvalidRequest(
                f"the stored definition of {kind} {key!r} cannot be read ({describe(exc)})",
                param=kind,
            ) from None

    def active_fit(self) -> dict | None:
        """The active base (kind, id, name) and whether it fits the attached SAEs now, with the
        problem when it does not; None while the live values are the base."""
        now = self.now()
        active = now.active
        if active is None:
            return None
        view = {
            "kind": active["kind"],
            "id": active["id"],
            "name": self._name(now, active),
            "fits": True,
            "problem": None,
        }
        try:
            self._active_base(now, active, None)
        except BaseUnfit as exc:
            view.update(fits=False, problem=exc.problem)
        return view

    def check_fits(self, kind: str, base_id: str) -> None:
        """400 invalid_feature_index if this base would not fit the attached SAEs as active."""
        now = self.now()
        try:
            self._active_base(now, {"kind": kind, "id": base_id}, None)
        except BaseUnfit as exc:
            name = self._name(now, {"kind": kind, "id": base_id}) or base_id
            raise InvalidFeatureIndex(
                f"{kind} {name!r} does not fit the attached SAEs: {exc.problem}", param=kind
            ) from None

    # the state ------------------------------------------------------------------------------------
    def _stamp(self) -> tuple[tuple[int, ...], tuple[Shelf, Shelf, Shelf]]:
        """The state's stamp and the books' shelves it names (call under the steering lock)."""
        return state_stamp(self.steering, self.clusters.shelf, self.circuits.shelf)

    def _snapshot(self, stamp: tuple[int, ...], shelves: tuple[Shelf, Shelf, Shelf]) -> Snapshot:
        """Copies of what the steering lock guards (call under it): plans are made without it."""
        return Snapshot.taken(self.steering, stamp, shelves)

    def now(self) -> Snapshot:
        """The steering state now (a copy, read without the lock)."""
        with self.steering.lock:
            return self._snapshot(*self._stamp())

    def _first_time(self, topic: str, stamp: tuple[int, ...]) -> bool:
        """Whether `topic` is not yet logged in this state (a log line per change, not request)."""
        if self._logged.get(topic) == stamp:
            return False
        self._logged[topic] = stamp
        return True

    def _name(self, now: Snapshot, active: dict) -> str | None:
        shelf = {"profile": now.profiles, "cluster": now.clusters, "circuit": now.circuits}[
            active["kind"]
        ]
        row = shelf.get(active["id"])
        return row["name"] if row is not None else None

    # resolving ------------------------------------------------------------------------------------
    def _resolve(
        self, now: Snapshot, profile: str | None, dial: Dial | None, promised: bool = False
    ) -> Plan:
        if dial is not None and dial.off:
            return self._off(now, profile)
        if profile is not None:
            return self._own_profile(now, profile, dial, promised)
        if not now.enabled:
            return NO_STEERING
        if now.active is not None:
            return self._active_base(now, now.active, dial)
        return self._live(now, dial)

    def _active_base(self, now: Snapshot, active: dict, dial: Dial | None) -> Plan:
        """The active profile, cluster or circuit through the dial; BaseUnfit (400) when it no
        longer fits the attached SAEs: never served unsteered (or partly steered) as if it were
        steered."""
        kind, base_id = active["kind"], active["id"]
        try:
            if kind == "profile":
                return self._active_profile(now, base_id, dial)
            if kind == "cluster":
                return self._cluster(now, base_id, dial)
            return self._circuits(now, circuit_ids(active), dial)
        except MillmError as exc:
            raise BaseUnfit(kind, self._name(now, active) or base_id, exc.message) from None
        except (
            ValueError,
            KeyError,
            TypeError,
        ) as exc:  # a stored definition that no longer parses
            raise BaseUnfit(
                kind,
                self._name(now, active) or base_id,
                f"its stored definition cannot be read ({describe(exc)})",
            ) from None

    def _scale(self, dial: Dial | None) -> float:
        return (
            1.0
            if dial is None
            else cluster_lambda(dial, None, self.limits.cluster_min, self.limits.maximum)
        )

    def _off(self, now: Snapshot, profile: str | None) -> Plan:
        # The base is not validated; the echo says only whether the dial changed anything.
        if profile is not None:
            would_steer = now.profiles.get(profile) is not None and bool(now.attached)
        else:
            base = now.active is not None or bool(now.features)
            would_steer = bool(now.attached) and now.enabled and base
        return turned_off("steering_intensity off", 0.0 if would_steer else None)

    def _own_profile(self, now: Snapshot, key: str, dial: Dial | None, promised: bool) -> Plan:
        row = self.steering.profiles.find_in(now.profiles, key)
        if not now.attached and not _needs_no_sae(row["document"]) and not promised:
            return Plan(None, "none", (("reason", "no SAE attached"), ("profile", row["name"])))
        scale = self._scale(dial)
        steered = profile_edit(row["document"], now.attached, scale, self.steering.resolvers)
        params = (("name", row["name"]), ("scope", "request"))
        return Plan(
            steered.edit,
            "profile",
            params,
            intensity=scale if dial and steered.edit else None,
            watches=steered.watches,
            applied=steered.applied,
            aborts=steered.aborts,
            level=scale,
        )

    def _active_profile(self, now: Snapshot, profile_id: str, dial: Dial | None) -> Plan:
        row = self.steering.profiles.find_in(now.profiles, profile_id)
        scale = self._scale(dial)
        steered = profile_edit(row["document"], now.attached, scale, self.steering.resolvers)
        if steered.edit is None and not steered.watches:
            return unsteered(dial, scale)
        params = (("name", row["name"]), ("version", now.version))
        return Plan(
            steered.edit,
            "profile",
            params,
            intensity=scale if dial else None,
            watches=steered.watches,
            applied=steered.applied,
            aborts=steered.aborts,
            level=scale,
        )

    def _spec(self, now: Snapshot, spec: dict, dial: Dial | None) -> Plan:
        if dial is not None and dial.off:
            return turned_off("steering_intensity off", 0.0)
        scale = self._scale(dial)
        steered = resolve_spec(
            spec,
            now.attached,
            scale,
            self.steering.resolvers,
            Refusals("steering", "steering", "sae_not_attached"),
        )
        return Plan(
            steered.edit,
            "request",
            (("scope", "request"),),
            intensity=scale if dial and steered.edit else None,
            watches=steered.watches,
            applied=steered.applied,
            aborts=steered.aborts,
            level=scale,
        )

    def _live(self, now: Snapshot, dial: Dial | None) -> Plan:
        scale = self._scale(dial)
        unattached = sorted(set(now.features) - set(now.attached))
        if unattached and self._first_time("live", now.stamp):
            # Kept for a later attach by design, but a request is steered without them: say so once.
            log.warning(
                "live steering values of %s are not applied: not attached", ", ".join(unattached)
            )
        through = {sae: scaled_ops(ops, scale) for sae, ops in now.features.items()}
        scaled = {sae: ops for sae, (ops, _) in through.items()}
        edit = feature_edit(scaled, now.attached)
        # Attached in the shared state, not here (another model, a path or file this replica lacks):
        # said, not hidden.
        missing = (
            (("unattached", " ".join(s for s in unattached if s in now.stored)),)
            if set(unattached) & now.stored
            else ()
        )
        if edit is None:
            return (
                Plan(None, "none", (("reason", "live values' SAEs not attached here"), *missing))
                if missing
                else unsteered(dial, scale)
                if now.features and not unattached
                else NO_STEERING
            )
        return Plan(
            edit,
            "live",
            (("version", now.version), *missing),
            intensity=scale if dial else None,
            applied=applied_sets(
                scaled, now.attached, clamped={sae: n for sae, (_, n) in through.items()}
            ),
            level=scale,
        )

    def _cluster(self, now: Snapshot, cluster_id: str, dial: Dial | None) -> Plan:
        row = self.clusters.find_in(now.clusters, cluster_id)
        return cluster_plan(row, stored_document(now.clusters, row), now, dial, self.limits)

    def _circuit(self, now: Snapshot, circuit_id: str, dial: Dial | None) -> Plan:
        row = self.circuits.find_in(now.circuits, circuit_id)
        return circuit_plan(row, stored_document(now.circuits, row), now, dial, self.limits)

    def _circuits(self, now: Snapshot, ids: list[str], dial: Dial | None) -> Plan:
        rows = [self.circuits.find_in(now.circuits, key) for key in ids]
        bases = [(row, stored_document(now.circuits, row)) for row in rows]
        return circuits_plan(bases, now, dial, self.limits)


def _needs_no_sae(document: dict) -> bool:
    """Whether a profile steers through vectors or probes alone (no SAE entry), so it applies
    with no SAE attached."""
    return not document.get("steering") and bool(document.get("vectors") or document.get("abort"))
