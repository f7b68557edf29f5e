"""POST/GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel: OpenAI's Batch API
(the SDK's client.batches.create / retrieve / list / cancel)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from millm.v1.batches.protocol import BatchList, BatchObject, CreateBatch
from millm.v1.batches.service import Batches
from millm.v1.http.deps import part, settings_of
from millm.v1.http.headers import string_list
from millm.v1.http.json_body import JsonRoute
from millm.v1.policy.field_policy import handle_unused, unused_locations
from millm.v1.serving.routes import strict

router = APIRouter(route_class=JsonRoute)


@router.post("/v1/batches", summary="Create a batch over an uploaded file")
def create_batch(body: CreateBatch, request: Request, response: Response) -> BatchObject:
    """The batch, validating; its lines then run in the background (GET it to follow)."""
    ignored = handle_unused(unused_locations(body), strict(request))
    cap = settings_of(request).ignored_fields_header_max_bytes
    if header := string_list(list(ignored), cap):
        response.headers["X-miLLM-Ignored-Fields"] = header
    return part(request, Batches).create(body)


@router.get("/v1/batches", summary="List batches")
def list_batches(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> BatchList:
    """A page of batches, newest first, after the batch `after`."""
    return part(request, Batches).listed(after, limit)


@router.get("/v1/batches/{batch_id}", summary="One batch")
def get_batch(batch_id: str, request: Request) -> BatchObject:
    """The batch, its counts current to its last recorded chunk."""
    return part(request, Batches).get(batch_id)


@router.post("/v1/batches/{batch_id}/lease", summary="Run a batch under your lease")
def lease_batch(batch_id: str, request: Request) -> BatchObject:
    """From now on the batch runs under the lease whose id X-miLLM-Lease sends (renewed by the
    batch with its own time, never released by it)."""
    return part(request, Batches).lease(batch_id)


@router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch")
def cancel_batch(batch_id: str, request: Request) -> BatchObject:
    """`cancelling`, then `cancelled` with its files: lines that ran are kept, the rest say so."""
    return part(request, Batches).cancel(batch_id)
