"""The management of SAEs, live steering and profiles, as the API presents it.

Every function reads the steering state under its lock, so a view is one consistent moment and
a check-then-change (delete an SAE that is not attached, update the active profile) cannot
interleave with another change. Store work happens here, on the caller's worker thread: the API
calls these from plain (threadpool) route functions, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from millm.errors import Conflict, InvalidRequest
from millm.formats.profiles import bundle, validate_profile
from millm.interp import sae_releases
from millm.interp.sae_files import SAEInfo
from millm.interp.steering import Attached, FeatureOp
from millm.kernel.model.sae_specs import parse_sae_spec
from millm.kernel.runtime.threads import in_passing_thread
from millm.lab.steering.parts import SteeringParts
from millm.store.steering import attachments

# SAEs ---------------------------------------------------------------------------------------------


def check_distinct(changes: dict, sent: int) -> None:
    """A feature may appear once in a batch of changes."""
    if len(changes) != sent:
        raise InvalidRequest("a feature appears twice in features", param="features")


class SteeringManagement:
    """SAEs, live steering and profiles as the API presents them."""

    def __init__(self, state: SteeringParts):
        self.state = state

    def sae_view(self, sae_id: str) -> dict:
        """An SAE's info with where it is attached (or why re-attaching failed)."""
        info = self.state.saes.get(sae_id)
        steering = self.state.steering
        with steering.lock:
            attached = steering.attached.get(sae_id)
            view = {
                **info.to_dict(),
                "attached": attached is not None,
                "attached_layer": attached.layer if attached else None,
            }
            if sae_id in steering.attach_errors:
                view["attach_error"] = steering.attach_errors[sae_id]
        return view

    def list_saes(self) -> list[dict]:
        """Every registered SAE."""
        return [self.sae_view(sae_id) for sae_id in list(self.state.saes.infos)]

    def delete_sae(self, sae_id: str) -> dict:
        """Forget an SAE and its live strengths (its labels are kept); 409 while it is attached
        or re-attaches on load."""
        self.state.saes.get(sae_id)
        with self.state.steering.lock:
            # Unloading the model empties the attachments in memory; the stored one still
            # re-attaches on reload.
            if sae_id in self.state.steering.attached or sae_id in attachments(self.state.store):
                raise Conflict(
                    f"{sae_id} is attached (or re-attaches when the model loads); detach it first",
                    param="sae_id",
                    code="sae_attached",
                )
            self.state.steering.set_features({}, clear=sae_id)
            self.state.saes.forget(sae_id)
            self.state.decoders.drop(sae_id)
        return {"id": sae_id, "deleted": True}

    def attached_view(self, sae_id: str, **extra) -> dict:
        """An SAE after an attach or detach: its view, the steering version and whether the
        active base still fits."""
        return {
            **self.sae_view(sae_id),
            **extra,
            "steering_version": self.state.steering.version,
            "active_base": self.state.planner.active_fit(),
        }

    def detach_sae(self, sae_id: str) -> dict:
        """Stop steering and reading through an SAE (its live strengths are kept)."""
        was = self.state.steering.detach(sae_id)
        return self.attached_view(sae_id, was_attached=was)

    # live steering --------------------------------------------------------------------------------
    def steering_view(self) -> dict:
        """The live state: enabled, version, the active base, and per SAE its features (op with
        strength or value) and attachment."""
        steering = self.state.steering
        with steering.lock:
            active = self.state.planner.active_fit()  # with whether it still fits the attached SAEs
            saes = []
            for sae_id in sorted(
                set(steering.features) | set(steering.attached) | set(steering.attach_errors)
            ):
                attached = steering.attached.get(sae_id)
                features = steering.features.get(sae_id, {})
                entry = {
                    "sae_id": sae_id,
                    "attached": attached is not None,
                    "layer": attached.layer if attached else None,
                    "features": [
                        {"index": i, **op.to_dict()} for i, op in sorted(features.items())
                    ],
                }
                if (
                    sae_id in steering.attach_errors
                ):  # attached in the store, not in this process: why
                    entry["attach_error"] = steering.attach_errors[sae_id]
                saes.append(entry)
            live, reason = steering.live_now()
            return {
                "enabled": steering.enabled,
                "version": steering.version,
                "source": (active["kind"] if active else "live") if steering.enabled else "off",
                "active_base": active,
                "active_profile": {"id": active["id"], "name": active["name"]}
                if active and active["kind"] == "profile"
                else None,
                "saes": saes,
                "live": live,
                "live_reason": reason,
            }

    def change_view(self, sae_ids: set[str]) -> dict:
        """After a change: the new state and whether the change affects new requests now."""
        with self.state.steering.lock:
            verdicts = [self.state.steering.live_now(sae_id) for sae_id in sorted(sae_ids)] or [
                self.state.steering.live_now()
            ]
            live = all(v[0] for v in verdicts)
            reason = next((v[1] for v in verdicts if not v[0]), verdicts[0][1])
            return {"live": live, "reason": reason, "steering": self.steering_view()}

    def set_features(
        self, changes: Mapping[tuple[str, int], FeatureOp | None], clear: str | bool = False
    ) -> dict:
        """Apply feature changes all or nothing (None, or an add of 0, clears a feature); `clear`
        first clears all or one SAE's."""
        if isinstance(clear, str):
            self.state.saes.get(clear)
        self.state.steering.set_features(dict(changes), clear=clear)
        touched = {sae_id for sae_id, _ in changes} | ({clear} if isinstance(clear, str) else set())
        return self.change_view(touched)

    def set_enabled(self, enabled: bool) -> dict:
        """Turn global steering on or off for every request admitted from now on."""
        self.state.steering.set_enabled(enabled)
        if enabled:
            return self.change_view(set())
        return {
            "live": True,
            "reason": "steering is off for every request admitted from now on",
            "steering": self.steering_view(),
        }

    # profiles -------------------------------------------------------------------------------------
    def profile_view(self, row: dict) -> dict:
        """A profile row with whether it is the active one."""
        return {**row, "active": row["id"] == self.state.steering.active_profile}

    def list_profiles(self) -> list[dict]:
        """Every saved profile."""
        return [self.profile_view(row) for row in self.state.profiles.all()]

    def get_profile(self, key: str) -> dict:
        """A profile by id or name."""
        return self.profile_view(self.state.profiles.find(key))

    def create_profile(self, document: dict) -> dict:
        """A new profile."""
        return self.profile_view(self.state.profiles.create(document))

    def save_current(self, name: str, description: str) -> dict:
        """A new profile holding the live values, ops included (with each SAE's attached, or else
        its own, layer)."""
        steering = self.state.steering
        with steering.lock:
            entries = []
            for sae_id, features in sorted(steering.features.items()):
                attached = steering.attached.get(sae_id)
                layer = attached.layer if attached else self.state.saes.get(sae_id).layer
                entries.append(
                    {
                        "sae_id": sae_id,
                        **({"layer": layer} if layer is not None else {}),
                        "features": [
                            {"index": i, **op.to_dict()} for i, op in sorted(features.items())
                        ],
                    }
                )
            return self.create_profile(
                {"name": name, "description": description, "steering": entries}
            )

    def update_profile(self, key: str, changes: dict, revision: int | None = None) -> dict:
        """Replace fields of a profile (409 revision_conflict when `revision` is not the stored
        one); the active one must stay applicable (checked before storing)."""
        steering = self.state.steering
        with steering.lock:
            row = self.state.profiles.find(key)
            active = row["id"] == steering.active_profile
            if active:
                steering.resolve(validate_profile({**row["document"], **changes}))
            row = self.state.profiles.update(key, changes, revision)
            if active:
                steering.bump()
            return self.profile_view(row)

    def delete_profile(self, key: str) -> dict:
        """Remove a profile; deleting the active one deactivates it."""
        with self.state.steering.lock:
            row = self.state.profiles.find(key)
            if row["id"] == self.state.steering.active_profile:
                self.state.steering.deactivate_profile()
            self.state.profiles.delete(row["id"])
        return {"id": row["id"], "name": row["name"], "deleted": True}

    def import_profiles(self, payload: dict, on_conflict: str) -> dict:
        """Import a profile document or a bundle, all or nothing."""
        rows = self.state.profiles.import_documents(payload, on_conflict)
        return {"object": "list", "data": [self.profile_view(row) for row in rows]}

    def export_profiles(self) -> dict:
        """A millm.profile-bundle of every profile."""
        return bundle([row["document"] for row in self.state.profiles.all()])

    def activate_profile(self, key: str) -> dict:
        """Make a profile the global base (checked against the attached SAEs first)."""
        row = self.state.steering.activate_profile(key)
        live = self.state.steering.enabled
        reason = (
            "active for every request admitted from now on"
            if live
            else "steering is disabled; the profile applies once it is enabled"
        )
        return {
            "profile": self.profile_view(row),
            "live": live,
            "reason": reason,
            "steering": self.steering_view(),
        }

    def deactivate_profile(self) -> dict:
        """The live values become the base again."""
        previous = self.state.steering.deactivate_profile()
        return {"deactivated": previous, "steering": self.steering_view()}

    async def register_sae(
        self,
        path: str | None,
        repo: str | None,
        revision: str | None,
        release: str | None = None,
        sae_id: str | None = None,
    ) -> tuple[SAEInfo, bool]:
        """Register an SAE file (a local path inside the allowed directories, a hub repository, or a
        SAELens release's SAE); whether it was new. Reading the file is blocking work: a passing
        thread."""
        return await in_passing_thread(
            self.state.registrations.sae,
            path,
            repo,
            revision,
            release,
            sae_id,
        )

    async def register_named_sae(self, text: str) -> tuple[SAEInfo, bool]:
        """Register an SAE named as `--sae` names one (a path, RELEASE:SAE_ID,
        OWNER/NAME[:PATH])."""
        spec = parse_sae_spec(text)
        # a repo's `path` is the folder inside it
        where = spec.repo_path if spec.repo else spec.path
        return await self.register_sae(where, spec.repo, spec.revision, spec.release, spec.sae_id)

    def releases(self, model: str | None) -> list[dict]:
        """SAELens's releases (optionally for models whose name contains `model`)."""
        return sae_releases.releases_view(model)

    def release(self, release: str) -> dict:
        """One SAELens release and its SAE ids."""
        return sae_releases.release_view(release)

    async def attach_sae(self, sae_id: str, layer: int | None) -> Attached:
        """Attach an SAE to the loaded model (torch work: a passing thread)."""
        return await in_passing_thread(self.state.switch.attach_sae, sae_id, layer)
