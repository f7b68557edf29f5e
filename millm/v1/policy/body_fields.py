"""What every request body shares: the base that parses strictly and keeps unknown fields (the
OpenAI bodies, which report them), the one that refuses them (millm's own bodies), the bounded
field types (OpenAI's ranges), and how a prompt field and a body's rows are counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MAX_CHOICES = 128


class StrictBody(BaseModel):
    """millm's own bodies: strict parsing, and an unknown key is a 400 naming it (nothing of
    them is reported as ignored)."""

    model_config = ConfigDict(strict=True, extra="forbid")


class OpenBody(BaseModel):
    """Strict parsing that keeps unknown fields for the field policy."""

    model_config = ConfigDict(strict=True, extra="allow")


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
TopN = Annotated[int, Field(ge=0, le=20)]
TokenIds = Annotated[list[int], Field(min_length=1)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
TokenCount = Annotated[int, Field(ge=1)]
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES)]


@dataclass(frozen=True)
class RowCount:
    """The rows a body makes before `n` multiplies them, and the field that made them (for a
    refusal)."""

    units: int
    param: str
    what: str


def listed_inputs(value) -> list:
    """A prompt or input (a string, a token-id list, or a list of either) as a list of items."""
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(v, int) for v in value):
        return [value]
    return list(value)
