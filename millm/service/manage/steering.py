"""The management of SAEs, live steering and profiles, as the API presents it.

Every function reads the steering state under its lock, so a view is one consistent moment and
a check-then-change (delete an SAE that is not attached, update the active profile) cannot
interleave with another change. Store work happens here, on the caller's worker thread: the API
calls these from plain (threadpool) route functions, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from millm.errors import Conflict, InvalidRequest
from millm.interp.profiles import bundle, validate_profile
from millm.interp.steering import FeatureOp
from millm.service.composition import ServerState


# SAEs ------------------------------------------------------------------------------------------------
def sae_view(state: ServerState, sae_id: str) -> dict:
    """An SAE's info with where it is attached (or why re-attaching failed)."""
    info = state.saes.get(sae_id)
    steering = state.steering
    with steering.lock:
        attached = steering.attached.get(sae_id)
        view = {**info.to_dict(), "attached": attached is not None, "attached_layer": attached.layer if attached else None}
        if sae_id in steering.attach_errors:
            view["attach_error"] = steering.attach_errors[sae_id]
    return view


def list_saes(state: ServerState) -> list[dict]:
    """Every registered SAE."""
    return [sae_view(state, sae_id) for sae_id in list(state.saes.infos)]


def delete_sae(state: ServerState, sae_id: str) -> dict:
    """Forget an SAE and its live strengths (its labels are kept); 409 while it is attached or re-attaches on load."""
    state.saes.get(sae_id)
    with state.steering.lock:
        # Unloading the model empties the attachments in memory; the stored one still re-attaches on reload.
        if sae_id in state.steering.attached or sae_id in state.store.attachments():
            raise Conflict(f"{sae_id} is attached (or re-attaches when the model loads); detach it first", param="sae_id", code="sae_attached")
        state.steering.set_features({}, clear=sae_id)
        state.saes.forget(sae_id)
        state.decoders.drop(sae_id)
    return {"id": sae_id, "deleted": True}


def attached_view(state: ServerState, sae_id: str, **extra) -> dict:
    """An SAE after an attach or detach: its view, the steering version and whether the active base still fits."""
    return {**sae_view(state, sae_id), **extra, "steering_version": state.steering.version, "active_base": state.planner.active_fit()}


def detach_sae(state: ServerState, sae_id: str) -> dict:
    """Stop steering and reading through an SAE (its live strengths are kept)."""
    was = state.steering.detach(sae_id)
    return attached_view(state, sae_id, was_attached=was)


# live steering ---------------------------------------------------------------------------------------
def steering_view(state: ServerState) -> dict:
    """The live state: enabled, version, the active base, and per SAE its features (op with strength or value) and attachment."""
    steering = state.steering
    with steering.lock:
        active = state.planner.active_fit()  # with whether it still fits the attached SAEs
        saes = []
        for sae_id in sorted(set(steering.features) | set(steering.attached) | set(steering.attach_errors)):
            attached = steering.attached.get(sae_id)
            features = steering.features.get(sae_id, {})
            entry = {
                "sae_id": sae_id,
                "attached": attached is not None,
                "layer": attached.layer if attached else None,
                "features": [{"index": i, **op.to_dict()} for i, op in sorted(features.items())],
            }
            if sae_id in steering.attach_errors:  # attached in the store, not in this process: why
                entry["attach_error"] = steering.attach_errors[sae_id]
            saes.append(entry)
        live, reason = steering.live_now()
        return {
            "enabled": steering.enabled,
            "version": steering.version,
            "source": (active["kind"] if active else "live") if steering.enabled else "off",
            "active_base": active,
            "active_profile": {"id": active["id"], "name": active["name"]} if active and active["kind"] == "profile" else None,
            "saes": saes,
            "live": live,
            "live_reason": reason,
        }


def change_view(state: ServerState, sae_ids: set[str]) -> dict:
    """After a change: the new state and whether the change affects new requests now."""
    with state.steering.lock:
        verdicts = [state.steering.live_now(sae_id) for sae_id in sorted(sae_ids)] or [state.steering.live_now()]
        live = all(v[0] for v in verdicts)
        reason = next((v[1] for v in verdicts if not v[0]), verdicts[0][1])
        return {"live": live, "reason": reason, "steering": steering_view(state)}


def set_features(state: ServerState, changes: Mapping[tuple[str, int], FeatureOp | None], clear: str | bool = False) -> dict:
    """Apply feature changes all or nothing (None, or an add of 0, clears a feature); `clear` first clears all or one SAE's."""
    if isinstance(clear, str):
        state.saes.get(clear)
    state.steering.set_features(dict(changes), clear=clear)
    touched = {sae_id for sae_id, _ in changes} | ({clear} if isinstance(clear, str) else set())
    return change_view(state, touched)


def set_enabled(state: ServerState, enabled: bool) -> dict:
    """Turn global steering on or off for every request admitted from now on."""
    state.steering.set_enabled(enabled)
    if enabled:
        return change_view(state, set())
    return {"live": True, "reason": "steering is off for every request admitted from now on", "steering": steering_view(state)}


# profiles --------------------------------------------------------------------------------------------
def profile_view(state: ServerState, row: dict) -> dict:
    """A profile row with whether it is the active one."""
    return {**row, "active": row["id"] == state.steering.active_profile}


def list_profiles(state: ServerState) -> list[dict]:
    """Every saved profile."""
    return [profile_view(state, row) for row in state.profiles.all()]


def get_profile(state: ServerState, key: str) -> dict:
    """A profile by id or name."""
    return profile_view(state, state.profiles.find(key))


def create_profile(state: ServerState, document: dict) -> dict:
    """A new profile."""
    return profile_view(state, state.profiles.create(document))


def save_current(state: ServerState, name: str, description: str) -> dict:
    """A new profile holding the live values, ops included (with each SAE's attached, or else its own, layer)."""
    steering = state.steering
    with steering.lock:
        entries = []
        for sae_id, features in sorted(steering.features.items()):
            attached = steering.attached.get(sae_id)
            layer = attached.layer if attached else state.saes.get(sae_id).layer
            entries.append({
                "sae_id": sae_id,
                **({"layer": layer} if layer is not None else {}),
                "features": [{"index": i, **op.to_dict()} for i, op in sorted(features.items())],
            })
        return create_profile(state, {"name": name, "description": description, "steering": entries})


def update_profile(state: ServerState, key: str, changes: dict, revision: int | None = None) -> dict:
    """Replace fields of a profile (409 revision_conflict when `revision` is not the stored one); the
    active one must stay applicable (checked before storing)."""
    steering = state.steering
    with steering.lock:
        row = state.profiles.find(key)
        active = row["id"] == steering.active_profile
        if active:
            steering.resolve(validate_profile({**row["document"], **changes}))
        row = state.profiles.update(key, changes, revision)
        if active:
            steering.bump()
        return profile_view(state, row)


def delete_profile(state: ServerState, key: str) -> dict:
    """Remove a profile; deleting the active one deactivates it."""
    with state.steering.lock:
        row = state.profiles.find(key)
        if row["id"] == state.steering.active_profile:
            state.steering.deactivate_profile()
        state.profiles.delete(row["id"])
    return {"id": row["id"], "name": row["name"], "deleted": True}


def import_profiles(state: ServerState, payload: dict, on_conflict: str) -> dict:
    """Import a profile document or a bundle, all or nothing."""
    rows = state.profiles.import_documents(payload, on_conflict)
    return {"object": "list", "data": [profile_view(state, row) for row in rows]}


def export_profiles(state: ServerState) -> dict:
    """A millm.profile-bundle of every profile."""
    return bundle([row["document"] for row in state.profiles.all()])


def activate_profile(state: ServerState, key: str) -> dict:
    """Make a profile the global base (checked against the attached SAEs first)."""
    row = state.steering.activate_profile(key)
    live = state.steering.enabled
    reason = "active for every request admitted from now on" if live else "steering is disabled; the profile applies once it is enabled"
    return {"profile": profile_view(state, row), "live": live, "reason": reason, "steering": steering_view(state)}


def deactivate_profile(state: ServerState) -> dict:
    """The live values become the base again."""
    previous = state.steering.deactivate_profile()
    return {"deactivated": previous, "steering": steering_view(state)}


def check_distinct(changes: dict, sent: int) -> None:
    """A feature may appear once in a batch of changes."""
    if len(changes) != sent:
        raise InvalidRequest("a feature appears twice in features", param="features")
