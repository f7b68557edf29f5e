"""/api/variants: steered variants, names any /v1 client can use as a model (issue 34, beyond the
spec)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.lab.variants.protocol import (
    VariantBody,
    VariantDeleted,
    VariantList,
    VariantPatch,
    VariantView,
)
from millm.lab.variants.service import VariantManagement
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)


@router.post(
    "/api/variants", summary="Create a steered variant", status_code=201, response_model=VariantView
)
def create_variant(body: VariantBody, request: Request) -> VariantView:
    """A name for a base model under a steering: listed in /v1/models and usable wherever a model
    name is."""
    return part(request, VariantManagement).create(body)


@router.get("/api/variants", summary="Steered variants, by name", response_model=VariantList)
def list_variants(request: Request) -> VariantList:
    """Every variant, each saying whether its steering fits the loaded model now."""
    return part(request, VariantManagement).list()


@router.get("/api/variants/{key}", summary="One steered variant", response_model=VariantView)
def get_variant(key: str, request: Request) -> VariantView:
    """A variant by name or id (404 variant_not_found)."""
    return part(request, VariantManagement).get(key)


@router.patch("/api/variants/{key}", summary="Change a steered variant", response_model=VariantView)
def patch_variant(key: str, body: VariantPatch, request: Request) -> VariantView:
    """Change the fields sent (`profile` and `steering` each replace the other); checked as a new
    one is."""
    return part(request, VariantManagement).update(key, body)


@router.delete(
    "/api/variants/{key}", summary="Delete a steered variant", response_model=VariantDeleted
)
def delete_variant(key: str, request: Request) -> VariantDeleted:
    """Forget a variant; requests naming it are 404 model_not_found from now on."""
    return part(request, VariantManagement).delete(key)
