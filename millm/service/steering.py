"""The steering state: attached SAEs, live feature values (add, clamp, ablate, cap), on/off, the active base, a version.

One owner (ServerState holds one Steering). Every change bumps the version and is stored, so
the state survives a restart. A request never reads this state while it runs: at admission it
takes an immutable plan (`plan_for`), so an operator's change is live for every request
admitted after it and a per-request profile can never undo one.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from millm.engine.jobs import Watch
from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit
from millm.errors import InvalidRequest, MillmError, ModelNotLoaded, describe
from millm.interp.formats import SAEInfo
from millm.interp.steering import Attached, FeatureOp, check_feature, check_strength, check_value, feature_edit
from millm.service.profiles import ProfileBook
from millm.service.resolution import Refusals, Resolvers, Steered, resolve_spec
from millm.service.saes import SAERegistry
from millm.store.database import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """What a request is steered by: the engine's edit and the watches of its conditions (each row
    carries both), what it is (X-miLLM-Steering), the resolved dial to echo
    (X-miLLM-Steering-Intensity) and a circuit's rung (X-miLLM-Circuit-Rung)."""

    edit: ResidualEdit | None
    kind: str  # none | live | profile | cluster | circuit | request
    params: tuple[tuple[str, object], ...] = ()
    intensity: float | None = None
    rung: int | None = None
    watches: tuple[Watch, ...] = ()

    @property
    def steers(self) -> bool:
        """Whether anything changes a row: an edit, or a condition that may."""
        return self.edit is not None or bool(self.watches)


NO_STEERING = Plan(None, "none")


class Steering:
    """Attachments, live strengths, enabled flag, active base (profile, cluster or circuit) and version;
    persisted on every change. `lock` guards them against the model-load thread."""

    def __init__(self, store: Store, registry: SAERegistry, profiles: ProfileBook):
        self.store, self.registry, self.profiles = store, registry, profiles
        self.enabled: bool = store.get_setting("steering_enabled", True)
        self.version: int = store.get_setting("steering_version", 0)
        legacy = store.get_setting("active_profile")  # schema 1 kept only a profile id
        self.active: dict | None = store.get_setting("active_base", {"kind": "profile", "id": legacy} if legacy else None)
        self.features: dict[str, dict[int, FeatureOp]] = {
            sae_id: {index: FeatureOp(row["op"], row["strength"], row["value"]) for index, row in rows.items()}
            for sae_id, rows in store.live_features().items()
        }
        self.attached: dict[str, Attached] = {}
        # How specs reach probes, vectors and the loaded model: ServerState wires them in.
        self.resolvers = Resolvers()
        self.attach_errors: dict[str, str] = {}
        # In memory only: moves with every version and also when a restore re-creates attachments
        # (which leaves the version as it is), so a plan cached for one state is never served in another.
        self.changes = 0
        self.lock = threading.RLock()

    # versioning --------------------------------------------------------------------------------
    def bump(self) -> int:
        """A new version: something that plans depend on changed."""
        self.version += 1
        self.changes += 1
        self.store.set_setting("steering_version", self.version)
        return self.version

    # attachments ----------------------------------------------------------------------------------
    def attach(self, lm: LoadedModel | None, sae_id: str, layer: int | None, restoring: bool = False) -> Attached:
        """Attach an SAE to the loaded model at its hook layer (or `layer`), after checking it fits.

        `restoring` re-creates a stored attachment after a load: the state the version describes
        is unchanged, so neither the store nor the version moves.
        """
        if lm is None:
            raise ModelNotLoaded("no model is loaded to attach an SAE to")
        info = self.registry.get(sae_id)
        layer = info.layer if layer is None else layer
        if layer is None:
            raise InvalidRequest(f"{sae_id} names no layer (its file has no hook layer); give layer", param="layer")
        check_fits(info, layer, lm)
        sae = self.registry.load(sae_id).to(lm.device)
        with self.lock:
            attached = Attached(info, sae, layer)
            self.attached[sae_id] = attached
            self.attach_errors.pop(sae_id, None)
            if restoring:
                self.changes += 1
            else:
                self.store.set_attachment(sae_id, layer)
                self.bump()
        return attached

    def detach(self, sae_id: str) -> bool:
        """Detach (keeps its live strengths for a later attach); returns whether it was attached."""
        self.registry.get(sae_id)
        with self.lock:
            was = self.attached.pop(sae_id, None) is not None
            self.attach_errors.pop(sae_id, None)
            self.store.set_attachment(sae_id, None)
            self.bump()
        return was

    def detach_all(self) -> None:
        """The model is going away: nothing stays attached (the stored attachments are kept for reload)."""
        with self.lock:
            self.attached.clear()
            self.bump()

    def restore(self, lm: LoadedModel) -> None:
        """After a model load, attach again what was attached before; a misfit is recorded, not fatal."""
        for sae_id, layer in self.store.attachments().items():
            try:
                self.attach(lm, sae_id, layer, restoring=True)
            except MillmError as exc:
                self.attach_errors[sae_id] = exc.message
                log.warning("could not re-attach %s at layer %s: %s", sae_id, layer, exc.message)
            except Exception as exc:  # a file that vanished or broke since; report, keep serving
                self.attach_errors[sae_id] = describe(exc)
                log.warning("could not re-attach %s: %s", sae_id, describe(exc))

    # live values ---------------------------------------------------------------------------------------
    def set_features(self, changes: dict[tuple[str, int], FeatureOp | float | None], clear: str | bool = False) -> int:
        """Apply validated changes atomically (a number is an add's strength; None, or an add of 0,
        removes a feature); returns the new version. An op the attached SAE cannot honour is a 400."""
        wanted = {key: _live_op(value) for key, value in changes.items()}
        for (sae_id, index), op in wanted.items():
            check_feature(self.registry.get(sae_id), index)
            if op is not None:
                if op.op == "add":
                    check_strength(op.strength)
                check_value(op.op, op.value)
        with self.lock:
            self._check_honoured(wanted)
            if clear is True:
                self.features = {}
            elif isinstance(clear, str):
                self.features.pop(clear, None)
            for (sae_id, index), op in wanted.items():
                features = self.features.setdefault(sae_id, {})
                if op is None:
                    features.pop(index, None)
                else:
                    features[index] = op
                if not features:
                    self.features.pop(sae_id, None)
            version = self.version + 1
            stored = {key: None if op is None else {"op": op.op, "strength": op.strength, "value": op.value} for key, op in wanted.items()}
            self.store.write_features(stored, version, clear=clear)
            self.version = version
            self.changes += 1
            return version

    def _check_honoured(self, wanted: dict[tuple[str, int], FeatureOp | None]) -> None:
        """Each attached SAE's live ops as they would be after the change, built once: a clamp its SAE
        cannot hold is refused now rather than at every request (an SAE attached later is checked then)."""
        touched = {sae_id for sae_id, _ in wanted}
        for sae_id in sorted(touched & set(self.attached)):
            after = dict(self.features.get(sae_id, {}))
            for (owner, index), op in wanted.items():
                if owner != sae_id:
                    continue
                if op is None:
                    after.pop(index, None)
                else:
                    after[index] = op
            feature_edit({sae_id: after}, self.attached, param="op")

    def set_enabled(self, enabled: bool) -> int:
        """Turn global steering on or off; returns the new version."""
        with self.lock:
            self.enabled = enabled
            self.store.set_setting("steering_enabled", enabled)
            return self.bump()

    @property
    def active_profile(self) -> str | None:
        """The active profile's id, when the base is a profile."""
        return self.active["id"] if self.active and self.active["kind"] == "profile" else None

    def set_active(self, kind: str | None, base_id: str | None) -> dict | None:
        """Make a profile, cluster or circuit the global base (None: the live values); returns the previous one."""
        with self.lock:
            previous = self.active
            self.active = {"kind": kind, "id": base_id} if kind else None
            self.store.set_setting("active_base", self.active)
            self.store.set_setting("active_profile", None)
            self.bump()
        return previous

    def deactivate(self, kind: str) -> str | None:
        """Back to the live values if a base of this kind is active; returns its id (None if none was)."""
        with self.lock:
            active = self.active
            if active is None or active.get("kind") != kind:
                return None
            self.set_active(None, None)
            return active["id"]

    def activate_profile(self, key: str) -> dict:
        """Make a profile the global steering base (checked against the attached SAEs first)."""
        row = self.profiles.find(key)
        self.resolve(row["document"])
        self.set_active("profile", row["id"])
        return row

    def deactivate_profile(self) -> str | None:
        """Back to the live values as the base, if a profile was active; returns its id."""
        with self.lock:
            if self.active_profile is None:
                return None
            previous = self.set_active(None, None)
        return previous["id"] if previous is not None else None

    # plans ------------------------------------------------------------------------------------------
    def resolve(self, document: dict, scale: float = 1.0) -> Steered:
        """A profile through the attached SAEs and the resolvers, its add strengths times `scale` (the dial); see profile_edit."""
        return profile_edit(document, self.attached, scale, self.resolvers)

    def live_now(self, sae_id: str | None = None) -> tuple[bool, str]:
        """Whether live-value changes affect new requests right now, and if not, why."""
        if not self.enabled:
            return False, "steering is disabled"
        if self.active is not None:
            return False, f"a {self.active['kind']} is active; live values apply once it is deactivated"
        if sae_id is not None and sae_id not in self.attached:
            return False, f"{sae_id} is not attached"
        if sae_id is None and not self.attached:
            return False, "no SAE is attached"
        return True, "live for every request admitted from now on"


def profile_edit(document: dict, attached: dict[str, Attached], scale: float = 1.0, resolvers: Resolvers | None = None) -> Steered:
    """A profile's edit and watches through these attached SAEs, its add strengths times `scale` (the dial).

    Every SAE it names must be attached at the profile's layer, every index fit, every op be
    honoured and every probe and vector be known, else 400: an entry is never left out, or a
    partly applied profile would pass for the whole one. Clamps, ablations and caps are not
    scaled by the dial: their value is a level to hold, not a push (interp.steering.FeatureOp.scaled).
    """
    refusals = Refusals(f"profile {document['name']!r}", "profile", code="profile_not_applicable")
    return resolve_spec(document, attached, scale, resolvers or Resolvers(), refusals)


def _live_op(value: FeatureOp | float | None) -> FeatureOp | None:
    """A live change as an op: a bare number is an add's strength; an add of 0 (or None) removes the feature."""
    if value is None:
        return None
    op = value if isinstance(value, FeatureOp) else FeatureOp("add", value)
    if op.op == "add" and not op.strength:
        return None
    return op


def check_fits(info: SAEInfo, layer: int, lm: LoadedModel) -> None:
    """d_in against the model's hidden size, layer against its depth: 400 with the figures."""
    hidden = lm.config.hidden_size
    depth = lm.config.num_hidden_layers
    if info.d_in != hidden:
        raise InvalidRequest(
            f"{info.id} reads vectors of width d_in={info.d_in}, but {lm.name} has hidden size {hidden}",
            param="sae_id",
            code="sae_model_mismatch",
        )
    if not 0 <= layer < depth:
        raise InvalidRequest(
            f"layer {layer} does not exist in {lm.name}, which has {depth} layers (0..{depth - 1})",
            param="layer",
            code="sae_model_mismatch",
        )
