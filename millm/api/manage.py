"""The management API: SAEs (/api/saes), live steering (/api/steering) and profiles (/api/profiles)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from millm.api.schema_rules import sent
from millm.errors import Conflict, InvalidRequest
from millm.interp.profiles import MAX_DESCRIPTION, bundle, validate_profile
from millm.interp.profiles import NAME as PROFILE_NAME
from millm.interp.steering import STRENGTH_LIMIT
from millm.service.paths import HUB_ID_PATTERN
from millm.service.state import ServerState
from millm.service.threads import in_passing_thread

router = APIRouter()


class StrictBody(BaseModel):
    """Strict bodies: unknown fields are refused here, where nothing needs to be reported."""

    model_config = ConfigDict(strict=True, extra="forbid")


# The limits below are stated in the schema only: check_strength and validate_profile enforce them,
# with messages that name the limit (a pydantic bound would answer first, in its own words).
STRENGTH_RANGE = {"minimum": -STRENGTH_LIMIT, "maximum": STRENGTH_LIMIT}


class RegisterSAE(StrictBody):
    """A local SAE (`path`) or one on the Hugging Face hub (`repo`, `path` inside it, `revision`)."""

    # A local path, or a hub repo (and the path inside it, which may be empty).
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["path"], "properties": {"path": {"type": "string", "minLength": 1}}}, sent("repo")]})
    path: str | None = Field(None, description="A local SAE (inside the data directory or MILLM_ALLOWED_PATHS), or the path inside `repo`.")
    repo: Annotated[str, Field(pattern=HUB_ID_PATTERN)] | None = Field(None, description="A Hugging Face hub repository, owner/name.")
    revision: str | None = None


class AttachSAE(StrictBody):
    """Attach at the SAE's own hook layer, or at `layer`."""

    layer: Annotated[int, Field(ge=0)] | None = None


class Strength(StrictBody):
    """One feature's strength, within ±200 (0 clears it)."""

    strength: Annotated[float, Field(json_schema_extra=STRENGTH_RANGE)]


class FeatureStrength(StrictBody):
    """A feature of an SAE and its strength."""

    sae_id: str
    index: Annotated[int, Field(ge=0)]
    strength: Annotated[float, Field(json_schema_extra=STRENGTH_RANGE)]


class ManyStrengths(StrictBody):
    """Set many strengths in one change; `replace` clears every other live value first."""

    features: list[FeatureStrength]
    replace: bool = False


ProfileName = Annotated[str, Field(json_schema_extra={"pattern": PROFILE_NAME.pattern}, description="1-120 letters, digits, space, '.', '_', '-'.")]
Description = Annotated[str, Field(json_schema_extra={"maxLength": MAX_DESCRIPTION})]


class ProfileFeature(StrictBody):
    index: Annotated[int, Field(ge=0)]
    strength: Annotated[float, Field(json_schema_extra=STRENGTH_RANGE)]


class ProfileEntry(StrictBody):
    sae_id: Annotated[str, Field(min_length=1)]
    layer: Annotated[int, Field(ge=0)] | None = None
    features: list[ProfileFeature]


class ProfileCreate(StrictBody):
    """A new profile: its name, description and steering entries (one per SAE)."""

    name: ProfileName
    description: Description | None = None
    steering: list[ProfileEntry] | None = None


class ProfileUpdate(StrictBody):
    """The fields given replace the stored ones (null keeps them); the result is validated whole."""

    name: ProfileName | None = None
    description: Description | None = None
    steering: list[ProfileEntry] | None = None


class SaveCurrent(StrictBody):
    """Save the live steering values as a new profile."""

    name: ProfileName
    description: Description = ""


def state_of(request: Request) -> ServerState:
    """The server state behind this app."""
    return request.app.state.millm


# SAEs ------------------------------------------------------------------------------------------------
def sae_view(state: ServerState, sae_id: str) -> dict:
    """An SAE's info with where it is attached (or why re-attaching failed)."""
    info = state.saes.get(sae_id)
    attached = state.steering.attached.get(sae_id)
    view = {**info.to_dict(), "attached": attached is not None, "attached_layer": attached.layer if attached else None}
    if sae_id in state.steering.attach_errors:
        view["attach_error"] = state.steering.attach_errors[sae_id]
    return view


@router.post("/api/saes", summary="Register an SAE (local path or hub repo)")
async def register_sae(body: RegisterSAE, request: Request):
    """Read and validate the SAE file; 201 when new, 200 when the same file was registered already."""
    state = state_of(request)
    info, created = await in_passing_thread(state.registrations.sae, body.path, body.repo, body.revision)
    return JSONResponse(sae_view(state, info.id), status_code=201 if created else 200)


@router.get("/api/saes", summary="List registered SAEs")
async def list_saes(request: Request):
    """Every registered SAE."""
    state = state_of(request)
    return {"object": "list", "data": [sae_view(state, sae_id) for sae_id in state.saes.infos]}


@router.get("/api/saes/{sae_id}", summary="One SAE")
async def get_sae(sae_id: str, request: Request):
    """An SAE's info and attachment."""
    return sae_view(state_of(request), sae_id)


@router.delete("/api/saes/{sae_id}", summary="Forget an SAE (detach it first)")
async def delete_sae(sae_id: str, request: Request):
    """Remove the registration and its live strengths; profiles naming it are kept."""
    state = state_of(request)
    state.saes.get(sae_id)
    # Unloading the model empties the attachments in memory; the stored one still re-attaches on reload.
    if sae_id in state.steering.attached or sae_id in state.store.attachments():
        raise Conflict(f"{sae_id} is attached (or re-attaches when the model loads); detach it first", param="sae_id", code="sae_attached")
    state.steering.set_strengths({}, clear=sae_id)
    state.saes.forget(sae_id)
    return {"id": sae_id, "deleted": True}


@router.post("/api/saes/{sae_id}/attach", summary="Attach an SAE to the loaded model (and lock the server to it)")
async def attach_sae(sae_id: str, request: Request, body: AttachSAE | None = None):
    """Attach at the SAE's hook layer (or the given one): d_in and layer are checked against the model,
    which is then locked for steering (see /api/models/{name}/unlock)."""
    state = state_of(request)
    layer = body.layer if body else None
    attached = await in_passing_thread(state.attach_sae, sae_id, layer)  # locks the server to the loaded model
    return {**sae_view(state, sae_id), "layer": attached.layer, "steering_version": state.steering.version,
            "active_base": state.planner.active_fit()}


@router.post("/api/saes/{sae_id}/detach", summary="Detach an SAE")
async def detach_sae(sae_id: str, request: Request):
    """Stop steering and reading through it; its live strengths are kept for a later attach."""
    state = state_of(request)
    was = state.steering.detach(sae_id)
    return {**sae_view(state, sae_id), "was_attached": was, "steering_version": state.steering.version,
            "active_base": state.planner.active_fit()}


@router.get("/api/saes/{sae_id}/features", summary="Search the SAE's feature labels")
async def sae_features(sae_id: str, request: Request, q: str = "", limit: Annotated[int, Query(ge=1, le=1000)] = 50):
    """Labelled features whose label, top tokens or example contain `q`."""
    state = state_of(request)
    info = state.saes.get(sae_id)
    found = await run_in_threadpool(state.saes.search, sae_id, q, limit)
    return {"object": "list", "sae_id": sae_id, "has_labels": info.has_labels, "query": q, "data": found}


# steering ------------------------------------------------------------------------------------------
def steering_view(state: ServerState) -> dict:
    """The live state: enabled, version, the active base, and per SAE its strengths and attachment."""
    steering = state.steering
    active = state.planner.active_fit()  # with whether it still fits the attached SAEs
    saes = []
    for sae_id in sorted(set(steering.strengths) | set(steering.attached)):
        attached = steering.attached.get(sae_id)
        features = steering.strengths.get(sae_id, {})
        saes.append({
            "sae_id": sae_id,
            "attached": attached is not None,
            "layer": attached.layer if attached else None,
            "features": [{"index": i, "strength": s} for i, s in sorted(features.items())],
        })
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


def change_response(state: ServerState, sae_ids: set[str]) -> dict:
    """After a change: the new state and whether the change affects new requests now."""
    verdicts = [state.steering.live_now(sae_id) for sae_id in sorted(sae_ids)] or [state.steering.live_now()]
    live = all(v[0] for v in verdicts)
    reason = next((v[1] for v in verdicts if not v[0]), verdicts[0][1])
    return {"live": live, "reason": reason, "steering": steering_view(state)}


@router.get("/api/steering", summary="Live steering state")
async def get_steering(request: Request):
    """Enabled, version, active profile, and every SAE's strengths."""
    return steering_view(state_of(request))


@router.put("/api/steering/saes/{sae_id}/features/{index}", summary="Set one feature's strength")
async def set_feature(sae_id: str, index: int, body: Strength, request: Request):
    """Strength within ±200 (0 clears); 400 invalid_feature_index past the SAE's width."""
    state = state_of(request)
    state.steering.set_strengths({(sae_id, index): body.strength})
    return change_response(state, {sae_id})


@router.delete("/api/steering/saes/{sae_id}/features/{index}", summary="Clear one feature")
async def clear_feature(sae_id: str, index: int, request: Request):
    """Remove one feature's live strength."""
    state = state_of(request)
    state.steering.set_strengths({(sae_id, index): None})
    return change_response(state, {sae_id})


@router.post("/api/steering/features", summary="Set many strengths at once")
async def set_features(body: ManyStrengths, request: Request):
    """All or nothing: every entry is checked before any is applied."""
    state = state_of(request)
    changes = {(f.sae_id, f.index): f.strength for f in body.features}
    if len(changes) != len(body.features):
        raise InvalidRequest("a feature appears twice in features", param="features")
    state.steering.set_strengths(changes, clear=body.replace)
    return change_response(state, {f.sae_id for f in body.features})


@router.delete("/api/steering/features", summary="Clear all live strengths (or one SAE's)")
async def clear_features(request: Request, sae_id: str | None = None):
    """Remove every live strength, or only those of `sae_id`."""
    state = state_of(request)
    if sae_id is not None:
        state.saes.get(sae_id)
    state.steering.set_strengths({}, clear=sae_id if sae_id is not None else True)
    return change_response(state, {sae_id} if sae_id else set())


@router.post("/api/steering/enable", summary="Turn global steering on")
async def enable(request: Request):
    """Requests admitted from now on are steered by the base (active profile or live values)."""
    state = state_of(request)
    state.steering.set_enabled(True)
    return change_response(state, set())


@router.post("/api/steering/disable", summary="Turn global steering off")
async def disable(request: Request):
    """Requests admitted from now on are unsteered (a request's own profile still applies)."""
    state = state_of(request)
    state.steering.set_enabled(False)
    return {"live": True, "reason": "steering is off for every request admitted from now on", "steering": steering_view(state)}


# profiles --------------------------------------------------------------------------------------------
def profile_view(state: ServerState, row: dict) -> dict:
    """A profile row with whether it is the active one."""
    return {**row, "active": row["id"] == state.steering.active_profile}


@router.get("/api/profiles", summary="List profiles")
async def list_profiles(request: Request):
    """Every saved profile."""
    state = state_of(request)
    return {"object": "list", "data": [profile_view(state, row) for row in state.profiles.all()]}


@router.post("/api/profiles", summary="Create a profile", status_code=201)
async def create_profile(body: ProfileCreate, request: Request):
    """A new profile from name, description and steering entries."""
    state = state_of(request)
    document = body.model_dump(exclude_none=True)
    return profile_view(state, state.profiles.create(document))


@router.post("/api/profiles/save-current", summary="Save the live values as a profile", status_code=201)
async def save_current(body: SaveCurrent, request: Request):
    """A new profile holding the live strengths (with each attached SAE's layer)."""
    state = state_of(request)
    steering = state.steering
    entries = []
    for sae_id, features in sorted(steering.strengths.items()):
        attached = steering.attached.get(sae_id)
        layer = attached.layer if attached else state.saes.get(sae_id).layer
        entries.append({
            "sae_id": sae_id,
            **({"layer": layer} if layer is not None else {}),
            "features": [{"index": i, "strength": s} for i, s in sorted(features.items())],
        })
    document = {"name": body.name, "description": body.description, "steering": entries}
    return profile_view(state, state.profiles.create(document))


@router.post("/api/profiles/deactivate", summary="Deactivate the active profile")
async def deactivate_profile(request: Request):
    """The live values become the steering base again."""
    state = state_of(request)
    previous = state.steering.deactivate_profile()
    return {"deactivated": previous, "steering": steering_view(state)}


@router.get("/api/profiles/export", summary="Export every profile as a bundle")
async def export_all(request: Request):
    """A millm.profile-bundle document of all profiles."""
    return bundle([row["document"] for row in state_of(request).profiles.all()])


@router.post("/api/profiles/import", summary="Import a profile document or a bundle", status_code=201)
async def import_profiles(
    request: Request,
    payload: Annotated[dict, Body()],
    on_conflict: Literal["fail", "rename"] = "fail",
):
    """Validated whole: a bad document refuses the import and nothing is stored."""
    state = state_of(request)
    rows = state.profiles.import_documents(payload, on_conflict)
    return {"object": "list", "data": [profile_view(state, row) for row in rows]}


@router.get("/api/profiles/{key}", summary="One profile")
async def get_profile(key: str, request: Request):
    """A profile by id or name."""
    state = state_of(request)
    return profile_view(state, state.profiles.find(key))


@router.put("/api/profiles/{key}", summary="Update a profile")
async def update_profile(key: str, body: ProfileUpdate, request: Request):
    """Replace the given fields; the result is validated whole."""
    state = state_of(request)
    changes = body.model_dump(exclude_none=True)
    row = state.profiles.find(key)
    active = row["id"] == state.steering.active_profile
    if active:  # the active profile must stay applicable: check before storing anything
        state.steering.resolve(validate_profile({**row["document"], **changes}))
    row = state.profiles.update(key, changes)
    if active:
        state.steering.bump()
    return profile_view(state, row)


@router.delete("/api/profiles/{key}", summary="Delete a profile")
async def delete_profile(key: str, request: Request):
    """Remove a profile; deleting the active one deactivates it."""
    state = state_of(request)
    row = state.profiles.find(key)
    if row["id"] == state.steering.active_profile:
        state.steering.deactivate_profile()
    state.profiles.delete(row["id"])
    return {"id": row["id"], "name": row["name"], "deleted": True}


@router.post("/api/profiles/{key}/activate", summary="Make a profile the global steering base")
async def activate_profile(key: str, request: Request):
    """Checked against the attached SAEs first (400 naming the misfit)."""
    state = state_of(request)
    row = state.steering.activate_profile(key)
    live = state.steering.enabled
    reason = "active for every request admitted from now on" if live else "steering is disabled; the profile applies once it is enabled"
    return {"profile": profile_view(state, row), "live": live, "reason": reason, "steering": steering_view(state)}


@router.get("/api/profiles/{key}/export", summary="Export a profile document")
async def export_profile(key: str, request: Request):
    """The versioned millm.profile document."""
    return state_of(request).profiles.find(key)["document"]
