"""The steering state: attached SAEs, live feature values (add, clamp, ablate, cap), on/off, the
active base, a version.

One owner (the composition root makes one Steering). Every change is stored with the next version,
so the state survives a restart and is shared by replicas on one PostgreSQL database. A request
never reads this state while it runs: at admission it takes an immutable plan (`plan_for`), so an
operator's change is live for every request admitted after it and a per-request profile can never
undo one. Over 400 lines because it is that one owner: every change (attach, values, base, reload)
takes its lock and writes its version here, and split apart they would share both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from millm.engine.loader import LoadedModel
from millm.errors import Conflict, InvalidRequest, MillmError, ModelNotLoaded, describe
from millm.interp.sae_files import SAEInfo
from millm.interp.steering import Attached, FeatureOp, check_feature, feature_edit, feature_op
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.runtime.replication import ALWAYS_IN_STEP, InStep
from millm.kernel.steering.resolution import Refusals, Resolvers, Steered, resolve_spec
from millm.kernel.steering.saes import SAERegistry
from millm.store.database import Store
from millm.store.steering import SteeringRows, SteeringWriter, steering_change, steering_state

log = logging.getLogger(__name__)


class Steering:
    """Attachments, live values, enabled flag, active base (profile, cluster or circuit) and
    version.

    The store holds the state (shared by every replica on one PostgreSQL); this is this process's
    copy of it: every change is one store transaction that takes the next version, after which
    this copy takes the change as written (read back whole only when another replica's change
    came in between, so it also carries what other replicas changed). Another replica's change
    arrives as a notice (kernel/runtime/replication.py), on which `reload` reads it too. `lock`
    guards the copy against the model-load and the notice threads."""

    def __init__(
        self,
        store: Store,
        registry: SAERegistry,
        profiles: ProfileBook,
        replica: InStep | None = None,
        resolvers: Resolvers | None = None,
    ):
        self.store, self.registry, self.profiles = store, registry, profiles
        self.replica = replica or ALWAYS_IN_STEP
        self.version, self.enabled = 0, True
        self.active: dict | None = None
        self.features: dict[str, dict[int, FeatureOp]] = {}
        self.stored: dict[
            str, tuple[int, str | None]
        ] = {}  # the stored attachments: sae_id -> (layer, model)
        self.attached: dict[
            str, Attached
        ] = {}  # those this process has attached to its loaded model
        # how specs reach probes, vectors and the loaded model
        self.resolvers = resolvers or Resolvers()
        self.attach_errors: dict[str, str] = {}
        # In memory only: moves with every reload and also when attachments change here without a
        # stored change (a restore, an unload), so a plan cached for one state is never served in
        # another.
        self.changes = 0
        self.lock = threading.RLock()
        self.reload()

    # the stored state -----------------------------------------------------------------------------
    def reload(self) -> None:
        """Read the stored state again (after a change here, or a notice of one elsewhere)."""
        with self.lock:
            self._apply(steering_state(self.store))

    def _apply(self, rows: SteeringRows) -> None:
        self.version, self.enabled, self.active = rows.version, rows.enabled, rows.active
        self.features = {
            sae_id: {
                index: FeatureOp(row["op"], row["strength"], row["value"])
                for index, row in ops.items()
            }
            for sae_id, ops in rows.features.items()
        }
        self.stored = dict(rows.attachments)
        self.changes += 1

    @contextmanager
    def _change(self) -> Iterator[SteeringWriter]:
        """One stored change (call under the lock): its writes commit with the next version, and
        this copy takes them as written. When the version moved by more than one, another replica
        wrote in between (its notice may not have arrived yet): then the whole state is read
        back."""
        with steering_change(self.store) as change:
            yield change
        if change.version != self.version + 1:
            self.reload()
            return
        # New dicts, never edits of the old ones: a reader holding the old state keeps one moment.
        features = {sae_id: dict(ops) for sae_id, ops in self.features.items()}
        stored = dict(self.stored)
        for write in change.written:
            self._take(write, features, stored)
        self.features, self.stored = features, stored
        self.version = change.version
        self.changes += 1

    def _take(
        self,
        write: tuple,
        features: dict[str, dict[int, FeatureOp]],
        stored: dict[str, tuple[int, str | None]],
    ) -> None:
        """One write of this process's change, applied to the new copy as the store now holds it."""
        kind, *args = write
        if kind == "features":
            changes, clear = args
            if clear is True:
                features.clear()
            elif isinstance(clear, str):
                features.pop(clear, None)
            for (sae_id, index), setting in changes.items():
                ops = features.setdefault(sae_id, {})
                if setting is None:
                    ops.pop(index, None)
                else:
                    ops[index] = FeatureOp(
                        setting["op"], setting.get("strength") or 0.0, setting.get("value")
                    )
                if not ops:
                    del features[sae_id]
        elif kind == "attachment":
            sae_id, layer, model = args
            if layer is None:
                stored.pop(sae_id, None)
            else:
                stored[sae_id] = (layer, model)
        elif args[0] == "steering_enabled":
            self.enabled = bool(args[1])
        elif args[0] == "active_base":
            self.active = args[1]

    def bump(self) -> int:
        """A new version with no other change: something plans depend on changed (an active
        profile was edited)."""
        with self.lock, self._change() as change:
            pass
        return change.version

    # attachments ----------------------------------------------------------------------------------
    def attach(
        self, lm: LoadedModel | None, sae_id: str, layer: int | None, restoring: bool = False
    ) -> Attached:
        """Attach an SAE to the loaded model at its hook layer (or `layer`), after checking it fits.

        `restoring` re-creates a stored attachment here (after a load, or one made by another
        replica): the stored state is unchanged, so neither the store nor the version moves.
        """
        if lm is None:
            raise ModelNotLoaded("no model is loaded to attach an SAE to")
        info = self.registry.get(sae_id)
        layer = info.layer if layer is None else layer
        if layer is None:
            raise InvalidRequest(
                f"{sae_id} names no layer (its file has no hook layer); give layer", param="layer"
            )
        check_fits(info, layer, lm)
        sae = self.registry.load(sae_id).to(lm.device)
        with self.lock:
            if (
                not restoring
            ):  # stored first: a write that fails leaves nothing attached here either
                with self._change() as change:
                    change.attachment(sae_id, layer, lm.name)
            attached = Attached(info, sae, layer)
            self.attached[sae_id] = attached
            self.attach_errors.pop(sae_id, None)
            self.changes += 1
        return attached

    def detach(self, sae_id: str) -> bool:
        """Detach (keeps its live strengths for a later attach); returns whether it was attached."""
        self.registry.get(sae_id)
        with self.lock:
            with self._change() as change:
                change.attachment(sae_id, None)
            was = self.attached.pop(sae_id, None) is not None
            self.attach_errors.pop(sae_id, None)
        return was

    def detach_all(self) -> None:
        """The model is going away: nothing stays attached here (the stored attachments are kept
        for reload)."""
        with self.lock:
            self.attached.clear()
            self.changes += 1

    def restore(
        self, lm: LoadedModel | None, may_read: Callable[[str], object] | None = None
    ) -> None:
        """Make what is attached here match the stored attachments for `lm` (after a load, or
        another replica's attach or detach). An SAE this process cannot attach (another model's,
        a path it may not read, a file it lacks, a misfit) is recorded in `attach_errors`, never
        fatal."""
        with self.lock:
            stored = dict(self.stored)
            for sae_id in [
                s for s, a in self.attached.items() if stored.get(s, (None,))[0] != a.layer
            ]:
                del self.attached[sae_id]
                self.changes += 1
            for sae_id in [s for s in self.attach_errors if s not in stored]:
                del self.attach_errors[sae_id]
        if lm is None:
            return
        for sae_id, (layer, model) in stored.items():
            if sae_id in self.attached:
                continue
            try:
                if model is not None and model != lm.name:
                    raise Conflict(
                        f"attached on model {model!r}; this replica serves {lm.name!r}",
                        param="sae_id",
                    )
                if may_read is not None:
                    may_read(self.registry.get(sae_id).path)
                self.attach(lm, sae_id, layer, restoring=True)
            except MillmError as exc:
                self.attach_errors[sae_id] = exc.message
                log.warning("could not attach %s at layer %s here: %s", sae_id, layer, exc.message)
            except Exception as exc:  # a file that vanished or broke since; report, keep serving
                self.attach_errors[sae_id] = describe(exc)
                log.warning("could not attach %s here: %s", sae_id, describe(exc))
        with self.lock:
            self.changes += 1  # the errors are part of what plans and views report

    # live values ----------------------------------------------------------------------------------
    def set_features(
        self, changes: dict[tuple[str, int], FeatureOp | float | None], clear: str | bool = False
    ) -> int:
        """Apply validated changes atomically (a number is an add's strength; None, or an add of 0,
        removes a feature); returns the new version. An op the attached SAE cannot honour is a
        400."""
        wanted = {key: _live_op(value) for key, value in changes.items()}
        for (
            sae_id,
            index,
        ) in wanted:  # the op's own fields were checked where it was made (feature_op)
            check_feature(self.registry.get(sae_id), index)
        with self.lock:
            self._check_honoured(wanted)
            stored = {
                key: None
                if op is None
                else {"op": op.op, "strength": op.strength, "value": op.value}
                for key, op in wanted.items()
            }
            with self._change() as change:
                change.features(stored, clear)
            return change.version

    def _check_honoured(self, wanted: dict[tuple[str, int], FeatureOp | None]) -> None:
        """Each attached SAE's live ops as they would be after the change, built once: a clamp its
        SAE cannot hold is refused now rather than at every request (an SAE attached later is
        checked then)."""
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
        with self.lock, self._change() as change:
            change.setting("steering_enabled", enabled)
        return change.version

    @property
    def active_profile(self) -> str | None:
        """The active profile's id, when the base is a profile."""
        return self.active["id"] if self.active and self.active["kind"] == "profile" else None

    def set_active(self, kind: str | None, base_id: str | None) -> dict | None:
        """Make a profile, cluster or circuit the global base (None: the live values); returns
        the previous one."""
        return self._set_base({"kind": kind, "id": base_id} if kind else None)

    def set_circuits(self, ids: list[str]) -> dict | None:
        """Make these circuits, active together in this order, the base (none: the live values);
        returns the previous base."""
        if not ids:
            return self._set_base(None)
        base: dict = {"kind": "circuit", "id": ids[0]}
        if len(ids) > 1:
            base["ids"] = list(ids)
        return self._set_base(base)

    def _set_base(self, base: dict | None) -> dict | None:
        with self.lock:
            previous = self.active
            with self._change() as change:
                change.setting("active_base", base)
                change.setting("active_profile", None)
        return previous

    def deactivate(self, kind: str) -> str | None:
        """Back to the live values if a base of this kind is active; returns its id (None if none
        was)."""
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

    # plans ----------------------------------------------------------------------------------------
    def resolve(self, document: dict, scale: float = 1.0) -> Steered:
        """A profile through the attached SAEs and the resolvers, its add strengths times `scale`
        (the dial); see profile_edit."""
        return profile_edit(document, self.attached, scale, self.resolvers)

    def live_now(self, sae_id: str | None = None) -> tuple[bool, str]:
        """Whether live-value changes affect new requests on this replica right now, and if not,
        why."""
        in_step, why = self.replica.in_step()
        if not in_step:
            return False, why
        if not self.enabled:
            return False, "steering is disabled"
        if self.active is not None:
            return (
                False,
                f"a {self.active['kind']} is active; live values apply once it is deactivated",
            )
        if sae_id is not None and sae_id not in self.attached:
            if sae_id in self.attach_errors:
                return (
                    False,
                    f"{sae_id} is attached in the shared state but not on this replica: "
                    f"{self.attach_errors[sae_id]}",
                )
            return False, f"{sae_id} is not attached"
        if sae_id is None and not self.attached:
            return False, "no SAE is attached"
        return True, "live for every request admitted from now on"


def profile_edit(
    document: dict,
    attached: dict[str, Attached],
    scale: float = 1.0,
    resolvers: Resolvers | None = None,
) -> Steered:
    """A profile's edit and watches through these attached SAEs, its add strengths times `scale`
    (the dial).

    Every SAE it names must be attached at the profile's layer, every index fit, every op be
    honoured and every probe and vector be known, else 400: an entry is never left out, or a partly
    applied profile would pass for the whole one. Clamps, ablations and caps are not scaled by the
    dial: their value is a level to hold, not a push (interp.steering.FeatureOp.scaled).
    """
    refusals = Refusals(f"profile {document['name']!r}", "profile", code="profile_not_applicable")
    return resolve_spec(document, attached, scale, resolvers or Resolvers(), refusals)


def _live_op(value: FeatureOp | float | None) -> FeatureOp | None:
    """A live change as an op: a bare number is an add's strength (checked by feature_op, the one
    check of an op's fields); an add of 0 (or None) removes the feature."""
    if value is None:
        return None
    op = value if isinstance(value, FeatureOp) else feature_op("add", value, None)
    if op.op == "add" and not op.strength:
        return None
    return op


def check_fits(info: SAEInfo, layer: int, lm: LoadedModel) -> None:
    """d_in against the model's hidden size, layer against its depth: 400 with the figures."""
    hidden = lm.config.hidden_size
    depth = lm.config.num_hidden_layers
    if info.d_in != hidden:
        raise InvalidRequest(
            f"{info.id} reads vectors of width d_in={info.d_in}, but {lm.name} has hidden size "
            f"{hidden}",
            param="sae_id",
            code="sae_model_mismatch",
        )
    if not 0 <= layer < depth:
        raise InvalidRequest(
            f"layer {layer} does not exist in {lm.name}, which has {depth} layers (0..{depth - 1})",
            param="layer",
            code="sae_model_mismatch",
        )
    if info.hook_point == "mlp" and not getattr(lm.residual, "taps_mlp_inputs", False):
        raise InvalidRequest(
            f"{info.id} is a transcoder: it reads block {layer}'s MLP input, which {lm.name}'s "
            f"{lm.runner.name} runner cannot tap (only the lean runner's families can)",
            param="sae_id",
            code="sae_model_mismatch",
        )


def circuit_ids(active: dict | None) -> list[str]:
    """The active circuits' ids in the order they were activated (none unless circuits are the
    base): one circuit is {"kind": "circuit", "id"}, several carry "ids" too."""
    if not active or active.get("kind") != "circuit":
        return []
    return list(active.get("ids") or [active["id"]])
