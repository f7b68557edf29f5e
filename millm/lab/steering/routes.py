"""The management API: SAEs (/api/saes), live steering (/api/steering) and profiles
(/api/profiles)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from millm.lab.steering.protocol import (
    AttachSAE,
    FeatureSetting,
    ManyStrengths,
    ProfileCreate,
    ProfileUpdate,
    RegisterSAE,
    SaveCurrent,
)
from millm.lab.steering.service import SteeringManagement, check_distinct
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


# SAEs ---------------------------------------------------------------------------------------------
@router.post("/api/saes", summary="Register an SAE (local path, hub repo, or SAELens release)")
async def register_sae(body: RegisterSAE, request: Request):
    """Read and validate the SAE file; 201 when new, 200 when the same file was registered
    already."""
    steering = part(request, SteeringManagement)
    if body.sae is not None:
        info, created = await steering.register_named_sae(body.sae)
    else:
        info, created = await steering.register_sae(
            body.path, body.repo, body.revision, body.release, body.sae_id
        )
    return JSONResponse(
        await run_in_threadpool(steering.sae_view, info.id), status_code=201 if created else 200
    )


@router.get("/api/saes", summary="List registered SAEs")
def list_saes(request: Request):
    """Every registered SAE."""
    return {"object": "list", "data": part(request, SteeringManagement).list_saes()}


@router.get("/api/saes/releases", summary="SAELens's published SAE releases")
def list_releases(
    request: Request,
    model: Annotated[
        str | None, Query(description="Only releases for models whose name contains this.")
    ] = None,
):
    """Every release in SAELens's registry (needs millm[saes]): its repository, model, layout,
    whether millm reads it, and how many SAEs it has."""
    return {"object": "list", "data": part(request, SteeringManagement).releases(model)}


@router.get("/api/saes/releases/{release}", summary="One SAELens release and its SAE ids")
def get_release(release: str, request: Request):
    """The release's SAEs: each `sae_id` to register by, its folder, Neuronpedia id and L0."""
    return part(request, SteeringManagement).release(release)


@router.get("/api/saes/{sae_id}", summary="One SAE")
def get_sae(sae_id: str, request: Request):
    """An SAE's info and attachment."""
    return part(request, SteeringManagement).sae_view(sae_id)


@router.delete("/api/saes/{sae_id}", summary="Forget an SAE (detach it first)")
def delete_sae(sae_id: str, request: Request):
    """Remove the registration and its live strengths; profiles naming it are kept."""
    return part(request, SteeringManagement).delete_sae(sae_id)


@router.post(
    "/api/saes/{sae_id}/attach",
    summary="Attach an SAE to the loaded model (and lock the server to it)",
)
async def attach_sae(sae_id: str, request: Request, body: AttachSAE | None = None):
    """Attach at the SAE's hook layer (or the given one): d_in and layer are checked against the
    model, which is then locked for steering (see /api/models/{name}/unlock)."""
    steering = part(request, SteeringManagement)
    attached = await steering.attach_sae(sae_id, body.layer if body else None)
    return await run_in_threadpool(steering.attached_view, sae_id, layer=attached.layer)


@router.post("/api/saes/{sae_id}/detach", summary="Detach an SAE")
def detach_sae(sae_id: str, request: Request):
    """Stop steering and reading through it; its live strengths are kept for a later attach."""
    return part(request, SteeringManagement).detach_sae(sae_id)


# steering -----------------------------------------------------------------------------------------
@router.get("/api/steering", summary="Live steering state")
def get_steering(request: Request):
    """Enabled, version, active profile, and every SAE's features (op with strength or value)."""
    return part(request, SteeringManagement).steering_view()


@router.put(
    "/api/steering/saes/{sae_id}/features/{index}",
    summary="Set one feature's op (add, clamp, ablate, cap)",
)
def set_feature(sae_id: str, index: int, body: FeatureSetting, request: Request):
    """add a strength within ±200 (0 clears), clamp or cap at a value >= 0, or ablate; 400
    invalid_feature_index past the SAE's width."""
    return part(request, SteeringManagement).set_features({(sae_id, index): body.checked()})


@router.delete("/api/steering/saes/{sae_id}/features/{index}", summary="Clear one feature")
def clear_feature(sae_id: str, index: int, request: Request):
    """Remove one feature's live value."""
    return part(request, SteeringManagement).set_features({(sae_id, index): None})


@router.post("/api/steering/features", summary="Set many features at once")
def set_features(body: ManyStrengths, request: Request):
    """All or nothing: every entry is checked before any is applied."""
    changes = {
        (f.sae_id, f.index): f.checked(f"features[{n}].") for n, f in enumerate(body.features)
    }
    check_distinct(changes, len(body.features))
    return part(request, SteeringManagement).set_features(changes, clear=body.replace)


@router.delete("/api/steering/features", summary="Clear all live values (or one SAE's)")
def clear_features(request: Request, sae_id: str | None = None):
    """Remove every live value, or only those of `sae_id`."""
    return part(request, SteeringManagement).set_features(
        {}, clear=sae_id if sae_id is not None else True
    )


@router.post("/api/steering/enable", summary="Turn global steering on")
def enable(request: Request):
    """Requests admitted from now on are steered by the base (active profile or live values)."""
    return part(request, SteeringManagement).set_enabled(True)


@router.post("/api/steering/disable", summary="Turn global steering off")
def disable(request: Request):
    """Requests admitted from now on are unsteered (a request's own profile still applies)."""
    return part(request, SteeringManagement).set_enabled(False)


# profiles -----------------------------------------------------------------------------------------
@router.get("/api/profiles", summary="List profiles")
def list_profiles(request: Request):
    """Every saved profile."""
    return {"object": "list", "data": part(request, SteeringManagement).list_profiles()}


@router.post("/api/profiles", summary="Create a profile", status_code=201)
def create_profile(body: ProfileCreate, request: Request):
    """A new profile from name, description and steering entries."""
    return part(request, SteeringManagement).create_profile(body.model_dump(exclude_none=True))


@router.post(
    "/api/profiles/save-current", summary="Save the live values as a profile", status_code=201
)
def save_current(body: SaveCurrent, request: Request):
    """A new profile holding the live strengths (with each attached SAE's layer)."""
    return part(request, SteeringManagement).save_current(body.name, body.description)


@router.post("/api/profiles/deactivate", summary="Deactivate the active profile")
def deactivate_profile(request: Request):
    """The live values become the steering base again."""
    return part(request, SteeringManagement).deactivate_profile()


@router.get("/api/profiles/export", summary="Export every profile as a bundle")
def export_all(request: Request):
    """A millm.profile-bundle document of all profiles."""
    return part(request, SteeringManagement).export_profiles()


@router.post(
    "/api/profiles/import", summary="Import a profile document or a bundle", status_code=201
)
def import_profiles(
    request: Request,
    payload: Annotated[dict, Body()],
    on_conflict: Literal["fail", "rename"] = "fail",
):
    """Validated whole: a bad document refuses the import and nothing is stored."""
    return part(request, SteeringManagement).import_profiles(payload, on_conflict)


@router.get("/api/profiles/{key}", summary="One profile")
def get_profile(key: str, request: Request):
    """A profile by id or name."""
    return part(request, SteeringManagement).get_profile(key)


@router.put("/api/profiles/{key}", summary="Update a profile")
def update_profile(key: str, body: ProfileUpdate, request: Request):
    """Replace the given fields; the result is validated whole."""
    changes = body.model_dump(exclude_none=True, exclude={"revision"})
    return part(request, SteeringManagement).update_profile(key, changes, body.revision)


@router.delete("/api/profiles/{key}", summary="Delete a profile")
def delete_profile(key: str, request: Request):
    """Remove a profile; deleting the active one deactivates it."""
    return part(request, SteeringManagement).delete_profile(key)


@router.post("/api/profiles/{key}/activate", summary="Make a profile the global steering base")
def activate_profile(key: str, request: Request):
    """Checked against the attached SAEs first (400 naming the misfit)."""
    return part(request, SteeringManagement).activate_profile(key)


@router.get("/api/profiles/{key}/export", summary="Export a profile document")
def export_profile(key: str, request: Request):
    """The versioned millm.profile document."""
    return part(request, SteeringManagement).get_profile(key)["document"]
