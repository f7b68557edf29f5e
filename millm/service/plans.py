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
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.errors import MillmError, describe
from millm.interp.binding import (
    BOUND,
    LayerBinding,
    circuit_bindings,
    circuit_mode,
    cluster_binding,
    members_edit,
)
from millm.interp.intensity import (
    Dial,
    applied_strength,
    circuit_lambda,
    cluster_lambda,
)
from millm.interp.mistudio import (
    Member,
    authored_intensity,
    circuit_members,
    cluster_members,
    declared_range,
    rung,
)
from millm.interp.steering import InvalidFeatureIndex, steering_edit
from millm.service.documents import CircuitBook, ClusterBook
from millm.service.steering import NO_STEERING, Plan, Steering


class BaseUnfit(InvalidFeatureIndex):
    """400 invalid_feature_index: the active profile, cluster or circuit no longer fits the attached
    SAEs (one detached or replaced, an index past the width), naming the base and the entry."""

    def __init__(self, kind: str, name: str, problem: str):
        super().__init__(
            f"the active {kind} {name!r} no longer fits the attached SAEs: {problem}. Requests are refused rather "
            f"than served unsteered; attach the SAEs it was made for, or deactivate it (POST /api/{kind}s/deactivate)",
            param="steering",
        )
        self.problem = problem


@dataclass(frozen=True)
class DialLimits:
    """The configured envelope: CLUSTER_INTENSITY_MIN, CIRCUIT_INTENSITY_MIN and the maximum."""

    cluster_min: float = 0.5
    circuit_min: float = 0.0
    maximum: float = 2.0


@dataclass(frozen=True)
class CircuitStatus:
    """Whether and how a circuit steers now (GET /api/circuits/active)."""

    mode: str  # full | slice_fallback | none
    bindings: dict[int, LayerBinding]
    rung: int


def circuit_status(document: dict, steering: Steering) -> CircuitStatus:
    """Bind a circuit's layers to the attached SAEs and say how it would be served."""
    bindings = circuit_bindings(document, steering.attached)
    return CircuitStatus(circuit_mode(bindings, circuit_members(document)), bindings, rung(document))


class Planner:
    """Resolves plans from the steering state and the imported documents."""

    def __init__(self, steering: Steering, clusters: ClusterBook, circuits: CircuitBook, limits: DialLimits):
        self.steering, self.clusters, self.circuits, self.limits = steering, clusters, circuits, limits

    def plan_for(self, profile: str | None, dial: Dial | None) -> Plan:
        """The immutable plan of one request."""
        steering = self.steering
        with steering.lock:
            if dial is not None and dial.off:
                return self._off(profile)
            if profile is not None:
                return self._own_profile(profile, dial)
            if not steering.enabled:
                return NO_STEERING
            if steering.active is not None:
                return self._active_base(steering.active, dial)
            return self._live(dial)

    def active_fit(self) -> dict | None:
        """The active base (kind, id, name) and whether it fits the attached SAEs now, with the
        problem when it does not; None while the live values are the base."""
        with self.steering.lock:
            active = self.steering.active
            if active is None:
                return None
            view = {"kind": active["kind"], "id": active["id"], "name": self._name(active), "fits": True, "problem": None}
            try:
                self._active_base(active, None)
            except BaseUnfit as exc:
                view.update(fits=False, problem=exc.problem)
            return view

    def check_fits(self, kind: str, base_id: str) -> None:
        """400 invalid_feature_index if this base would not fit the attached SAEs as the active one."""
        with self.steering.lock:
            try:
                self._active_base({"kind": kind, "id": base_id}, None)
            except BaseUnfit as exc:
                name = self._name({"kind": kind, "id": base_id}) or base_id
                raise InvalidFeatureIndex(f"{kind} {name!r} does not fit the attached SAEs: {exc.problem}", param=kind) from None

    def _name(self, active: dict) -> str | None:
        book = {"profile": self.steering.profiles, "cluster": self.clusters, "circuit": self.circuits}[active["kind"]]
        try:
            return book.find(active["id"])["name"]
        except MillmError:
            return None

    def _active_base(self, active: dict, dial: Dial | None) -> Plan:
        """The active profile, cluster or circuit through the dial; BaseUnfit (400) when it no longer
        fits the attached SAEs: never served unsteered (or partly steered) as if it were steered."""
        kind, base_id = active["kind"], active["id"]
        try:
            if kind == "profile":
                return self._active_profile(base_id, dial)
            if kind == "cluster":
                return self._cluster(base_id, dial)
            return self._circuit(base_id, dial)
        except MillmError as exc:
            raise BaseUnfit(kind, self._name(active) or base_id, exc.message) from None
        except (ValueError, KeyError, TypeError) as exc:  # a stored definition that no longer parses
            raise BaseUnfit(kind, self._name(active) or base_id, f"its stored definition cannot be read ({describe(exc)})") from None

    def _scale(self, dial: Dial | None) -> float:
        return 1.0 if dial is None else cluster_lambda(dial, None, self.limits.cluster_min, self.limits.maximum)

    def _off(self, profile: str | None) -> Plan:
        # The base is not validated; the echo says only whether the dial changed anything.
        if profile is not None:
            known = any(profile in (row["id"], row["name"]) for row in self.steering.profiles.all())
            would_steer = known and bool(self.steering.attached)
        else:
            base = self.steering.active is not None or bool(self.steering.strengths)
            would_steer = bool(self.steering.attached) and self.steering.enabled and base
        return Plan(None, "none", (("reason", "steering_intensity off"),), intensity=0.0 if would_steer else None)

    def _own_profile(self, key: str, dial: Dial | None) -> Plan:
        row = self.steering.profiles.find(key)
        if not self.steering.attached:
            return Plan(None, "none", (("reason", "no SAE attached"), ("profile", row["name"])))
        scale = self._scale(dial)
        edit = self.steering.resolve(row["document"], scale=scale)
        return Plan(edit, "profile", (("name", row["name"]), ("scope", "request")), intensity=scale if dial and edit else None)

    def _active_profile(self, profile_id: str, dial: Dial | None) -> Plan:
        row = self.steering.profiles.find(profile_id)
        scale = self._scale(dial)
        edit = self.steering.resolve(row["document"], scale=scale)
        if edit is None:
            return NO_STEERING
        return Plan(edit, "profile", (("name", row["name"]), ("version", self.steering.version)), intensity=scale if dial else None)

    def _live(self, dial: Dial | None) -> Plan:
        scale = self._scale(dial)
        strengths = {sae: {i: applied_strength(s, 1, scale) for i, s in features.items()} for sae, features in self.steering.strengths.items()}
        edit = steering_edit(strengths, self.steering.attached)
        if edit is None:
            return NO_STEERING
        return Plan(edit, "live", (("version", self.steering.version),), intensity=scale if dial else None)

    def _cluster(self, cluster_id: str, dial: Dial | None) -> Plan:
        row = self.clusters.find(cluster_id)
        document = self.clusters.document(row)
        binding = cluster_binding(document, self.steering.attached)
        if dial is None:
            intensity = row["intensity"]
        else:
            intensity = cluster_lambda(dial, declared_range(document), self.limits.cluster_min, self.limits.maximum)
        members = [Member(binding.layer, m.feature_idx, m.strength, m.sign) for m in cluster_members(document)]
        edit = members_edit(members, {binding.layer: binding}, self.steering.attached, intensity)
        if edit is None:
            return NO_STEERING
        return Plan(edit, "cluster", (("name", row["name"]), ("version", self.steering.version)), intensity=intensity if dial else None)

    def _circuit(self, circuit_id: str, dial: Dial | None) -> Plan:
        row = self.circuits.find(circuit_id)
        document = self.circuits.document(row)
        status = circuit_status(document, self.steering)
        if status.mode == "none":
            details = "; ".join(f"layer {layer}: {b.detail}" for layer, b in status.bindings.items())
            raise InvalidFeatureIndex(f"none of its member layers binds to an attached SAE ({details})", param="steering")
        declared = declared_range(document)
        if dial is None:
            intensity = authored_intensity(document)
        elif status.mode == "full":
            intensity = circuit_lambda(dial, declared, self.limits.circuit_min, self.limits.maximum)
        else:
            intensity = cluster_lambda(dial, declared, self.limits.cluster_min, self.limits.maximum)
        edit = members_edit(circuit_members(document), status.bindings, self.steering.attached, intensity)
        if edit is None:
            return NO_STEERING
        params = (("name", row["name"]), ("mode", status.mode), ("version", self.steering.version))
        return Plan(edit, "circuit", params, intensity=intensity if dial else None, rung=status.rung if status.mode == "full" else None)


def bound_layers(status: CircuitStatus) -> list[int]:
    """The layers of a circuit that bind now."""
    return [layer for layer, binding in status.bindings.items() if binding.status in BOUND]
