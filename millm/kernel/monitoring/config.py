"""Monitoring's settings as stored: the monitor reads them, PUT /api/monitoring changes them."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from millm.engine.jobs import PositionWord
from millm.formats.document_fields import Indices

MAX_TOP_K = 64  # features kept per position


class MonitoringConfig(BaseModel):
    """The monitoring settings, as stored (PUT /api/monitoring changes any of them)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    enabled: bool = False
    sae_id: str | None = None  # None: the only attached SAE
    features: Indices | None = None  # None: all features; []: positions only
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = 5
    positions: PositionWord = "completion"
    percentiles: bool = False  # add each entry's percentile in the SAE's calibration on the model
    tokens: bool = False  # add each position's token text
    labels: bool = False  # add each entry's feature label
