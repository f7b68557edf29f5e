"""The model registry's bodies (/api/models)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from millm.kernel.model.leases import MAX_TTL_S
from millm.v1.policy.body_fields import StrictBody


class RegisterModel(StrictBody):
    """A checkpoint directory, a .gguf file or a Hugging Face hub id; `name` defaults to the
    source's."""

    source: Annotated[
        str,
        Field(
            min_length=1,
            description="A checkpoint directory or .gguf file (inside the data directory or "
            "MILLM_ALLOWED_PATHS), or a hub id.",
        ),
    ]
    # check_name's rule (1-200 printable characters, no surrounding spaces), stated in ASCII for
    # generators.
    name: (
        Annotated[str, Field(json_schema_extra={"pattern": r"^[!-~](?:[ -~]{0,198}[!-~])?$"})]
        | None
    ) = None


Ttl = Annotated[
    int, Field(ge=1, le=MAX_TTL_S, description="Seconds the lease lives (default 7200).")
]


class LeaseRequest(StrictBody):
    """POST /api/models/{name}/lease: who holds the lease and why (free text, shown to everyone
    a swap is refused), and for how long."""

    holder: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128)]
    reason: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=512)]
    ttl_seconds: Ttl | None = None


class RenewLease(StrictBody):
    """POST /api/models/{name}/lease/renew: the lease ends `ttl_seconds` from now."""

    ttl_seconds: Ttl | None = None
