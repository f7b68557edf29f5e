"""The steering-vector file: what GET /api/vectors/{id}/export writes and POST /api/vectors/import
reads.

    {"kind": "millm.steering-vector", "version": 1, "name": "pirate", "description": "",
     "model": "tiny-llama", "layer": 1, "hook_point": "resid_post", "normalisation": "unit",
     "norm": 3.21, "d_model": 64, "method": "mean", "pairs": 4, "values": [0.0123, ...]}

`values` is the unit direction, d_model float32 numbers written as JSON numbers (each float32
value written as the shortest decimal that reads back to it, so an export imports bit for bit);
`norm` is the length the training measured (a strength of `norm` adds the mean difference).
`model` and `d_model` say which model it applies to; `layer` and `hook_point` where. Strict:
unknown keys, NaN and infinities, a wrong count of values, or values that are not a unit vector
are refused, naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from millm.formats.document_fields import Document, no_bools, refusal
from millm.formats.document_schemas import MAX_DESCRIPTION, ProfileName

VectorKind = Literal["millm.steering-vector"]
VectorVersion = Literal[1]
VECTOR_KIND: VectorKind = "millm.steering-vector"
VECTOR_VERSION: VectorVersion = 1
HookPoint = Literal["resid_post", "resid_pre"]
MAX_D_MODEL = 65536
# |‖values‖ - 1| allowed: float32 rounding of a unit vector is ~1e-7, a hand-edited file may carry
# fewer digits
UNIT_TOLERANCE = 1e-4


class VectorFile(Document):
    """A millm.steering-vector file: a unit direction at a model's residual point, and its
    trained length."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

    kind: VectorKind
    version: Annotated[VectorVersion, no_bools("1")]
    name: ProfileName
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] = ""
    model: Annotated[
        str,
        Field(min_length=1, max_length=200, description="The served model name it was trained on."),
    ]
    layer: Annotated[int, Field(ge=0)]
    hook_point: HookPoint
    normalisation: Literal["unit"]
    norm: Annotated[
        float,
        Field(
            ge=0, description="The trained length: a strength of `norm` adds the mean difference."
        ),
    ]
    d_model: Annotated[int, Field(ge=1, le=MAX_D_MODEL)]
    method: Literal["mean", "pca"]
    pairs: Annotated[int, Field(ge=0, description="How many prompt pairs it was trained on.")]
    values: Annotated[
        list[float],
        Field(
            min_length=1, max_length=MAX_D_MODEL, description="The unit direction, d_model numbers."
        ),
    ]

    @field_validator("values")
    @classmethod
    def _unit_of_width(cls, values: list[float], info: ValidationInfo) -> list[float]:
        width = info.data.get("d_model")
        if width is not None and len(values) != width:
            raise refusal(
                "vector_length",
                "must hold d_model = {width} values, got {count}",
                width=width,
                count=len(values),
            )
        length = float(np.linalg.norm(np.asarray(values, dtype=np.float64)))
        if abs(length - 1.0) > UNIT_TOLERANCE:
            raise refusal(
                "vector_not_unit",
                "normalisation 'unit' needs values of norm 1, got {length}",
                length=f"{length:.6g}",
            )
        return values


def file_of(meta: dict, unit: np.ndarray) -> dict:
    """The file of a stored vector (its metadata row and float32 unit direction), as JSON-ready
    data."""
    return VectorFile(
        kind=VECTOR_KIND,
        version=VECTOR_VERSION,
        name=meta["name"],
        description=meta["description"],
        model=meta["model"],
        layer=meta["layer"],
        hook_point=meta["hook_point"],
        normalisation="unit",
        norm=meta["norm"],
        d_model=meta["d_model"],
        method=meta["method"],
        pairs=meta["pairs"],
        values=[float(x) for x in unit.astype(np.float32)],
    ).model_dump()


def values_of(document: VectorFile) -> np.ndarray:
    """A file's values as the stored float32 direction."""
    return np.asarray(document.values, dtype=np.float32)
