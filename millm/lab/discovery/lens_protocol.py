"""Body and answer of POST /api/lens: the logit lens over one text or conversation."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from millm.lab.discovery.protocol import (
    ReadOne,
    Steering,
    SteeringUsed,
    TokenRead,
)

MAX_LENS_TOP_K = 10


class LensRequest(ReadOne):
    """POST /api/lens: what each block predicts over one text or conversation."""

    layers: (
        Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=256)] | None
    ) = Field(None, description="The blocks whose output is read (default: every block).")
    positions: Literal["all", "last"] = Field(
        "all",
        description="Every position of the prompt, or only its last (what the next token will be).",
    )
    top_k: Annotated[int, Field(ge=1, le=MAX_LENS_TOP_K)] = 3
    steering: Steering = None


class LensToken(BaseModel):
    """A token the lens reads out, with its probability."""

    token_id: int
    token: str
    probability: float


class LensCell(BaseModel):
    """One block's reading at one position: its top tokens, and the probability it gives the
    model's final prediction there."""

    layer: int
    top: list[LensToken]
    final_probability: float


class LensPosition(BaseModel):
    """One position: what the model finally predicts after it, and what each chosen block would."""

    position: int
    final: LensToken
    layers: list[LensCell]


class LensResponse(BaseModel):
    """The lens over the prompt: blocks in order, positions in order."""

    object: Literal["lens"] = "lens"
    model: str
    steered: bool
    steering: SteeringUsed
    layers: list[int]
    tokens: list[TokenRead]
    predictions: list[LensPosition]
