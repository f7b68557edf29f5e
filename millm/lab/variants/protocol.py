"""Bodies and answers of /api/variants: steered variants, names a client uses as models.

A variant is a base model and its steering: a saved `profile` or a request's own `steering` (SAE
features, steering vectors, probe conditions), through a `steering_intensity`, with `scoring`
saying whether scoring requests (next-token and echo logprobs) naming it are steered. The field
names are those of a /v1 request, which a variant stands for.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from millm.formats.document_schemas import MAX_DESCRIPTION, ProfileName

Scoring = Literal["unsteered", "steered"]
Intensity = Annotated[
    float | str | None,
    Field(
        description="The dial every request naming the variant is steered through (a number 0-2 "
        "or off/min/max; default: the steering's own strengths). A request's own "
        "steering_intensity replaces it."
    ),
]


class VariantBody(BaseModel):
    """POST /api/variants: a new variant (exactly one of `profile` and `steering`)."""

    model_config = ConfigDict(extra="forbid")

    name: ProfileName
    base: Annotated[str, Field(min_length=1, description="The registered model it steers.")]
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] = ""
    profile: str | None = Field(None, description="A saved profile, by name or id.")
    steering: dict | None = Field(
        None,
        description="A request's own steering: {steering: [...], vectors: [...], abort: [...]}.",
    )
    steering_intensity: Intensity = None
    scoring: Scoring = Field(
        "unsteered",
        description="unsteered: scoring requests naming the variant see the base model (the "
        "judge's guarantee); steered: they see the variant's steering.",
    )


class VariantPatch(BaseModel):
    """PATCH /api/variants/{name}: the fields to change; `profile` and `steering` each replace
    the other."""

    model_config = ConfigDict(extra="forbid")

    name: ProfileName | None = None
    base: Annotated[str, Field(min_length=1)] | None = None
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] | None = None
    profile: str | None = None
    steering: dict | None = None
    steering_intensity: Intensity = None
    scoring: Scoring | None = None


class VariantView(BaseModel):
    """A stored variant, and whether its steering fits the attached SAEs now (known while its
    base is loaded)."""

    id: str
    object: Literal["variant"] = "variant"
    name: str
    base: str
    description: str
    profile: str | None = None
    steering: dict | None = None
    steering_intensity: float | str | None = None
    scoring: Scoring
    created_at: float
    updated_at: float
    fits: bool | None = None  # null while the base is not loaded
    problem: str | None = None  # why it does not fit


class VariantList(BaseModel):
    """Every variant, by name."""

    object: Literal["list"] = "list"
    data: list[VariantView]


class VariantDeleted(BaseModel):
    """What DELETE answers."""

    id: str
    name: str
    object: Literal["variant"] = "variant"
    deleted: Literal[True] = True
