"""The model registry's bodies (/api/models)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

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
