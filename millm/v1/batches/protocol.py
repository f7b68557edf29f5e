"""The Batch API's bodies and objects, in OpenAI's shape (with millm's block beside them)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from millm.v1.objects import WireModel
from millm.v1.policy.body_fields import OpenBody, StrictBody

MAX_OUTPUT_S = 2_592_000  # 30 days, OpenAI's default and most
MIN_OUTPUT_S = 3_600


class OutputExpiry(StrictBody):
    """How long the output and error files are kept, from the batch's creation."""

    anchor: Literal["created_at"]
    seconds: Annotated[int, Field(ge=MIN_OUTPUT_S, le=MAX_OUTPUT_S)]


class CreateBatch(OpenBody):
    """POST /v1/batches."""

    input_file_id: Annotated[str, Field(min_length=1, max_length=64)]
    endpoint: Annotated[str, Field(min_length=1, max_length=64)]
    completion_window: Annotated[str, Field(min_length=1, max_length=16)]
    metadata: dict[str, str] | None = None
    output_expires_after: OutputExpiry | None = None
    # Scoring lines may share padded passes (faster; their log-probabilities then differ from the
    # synchronous route's in the last bits). None: MILLM_BATCH_PACK_DEFAULT.
    pack: bool | None = None

    @field_validator("metadata")
    @classmethod
    def _sixteen_pairs(cls, value):
        if value is not None and len(value) > 16:
            raise ValueError(f"metadata holds at most 16 pairs, got {len(value)}")
        return value


class RequestCounts(WireModel):
    """How many lines there are, and how many ended well and badly so far."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchExtension(WireModel):
    """What millm says of a batch beyond OpenAI's fields (its inner bookkeeping is not shown)."""

    pack: bool = False
    waiting_reason: Literal["queued", "model_not_resident", "lease_unavailable"] | None = None
    lease_mode: Literal["own", "caller"] | None = None
    completion_window_extension: bool
    output_expires_after: int


class BatchObject(WireModel):
    """A batch as OpenAI's SDK reads it; `millm` holds what millm adds."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: dict[str, Any] | None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    millm: BatchExtension


class BatchList(WireModel):
    """GET /v1/batches: a page of batches, newest first."""

    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
