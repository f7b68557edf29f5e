"""The probes' update body (/api/probes/{key})."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from millm.formats.document_schemas import MAX_DESCRIPTION, ProfileName


class ProbeUpdate(BaseModel):
    """The fields given replace the stored ones (null keeps them); the result is validated whole."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: ProfileName | None = None
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] | None = None
    # Validated with the whole document (whose refusals name the field as the document's pages do);
    # the served schema states the detector's format (server/openapi.py).
    detector: dict | None = None
