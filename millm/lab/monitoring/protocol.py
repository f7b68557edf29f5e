"""The body that changes monitoring's settings (/api/monitoring); as stored they are the
kernel's MonitoringConfig."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from millm.engine.jobs import PositionWord
from millm.kernel.monitoring.config import MAX_TOP_K


class MonitoringSettings(BaseModel):
    """Fields to change; those left out keep their value."""

    model_config = ConfigDict(strict=True, extra="forbid")

    # Absent keeps the stored value; only sae_id and features take null (the only SAE; all
    # features). enabled, top_k, positions and the flags may be left out but not be null: pydantic
    # has no typed spelling for that, so their None defaults (never validated, dropped by
    # exclude_unset) are ignored for mypy.
    enabled: bool = None  # type: ignore[assignment]  # absent, never null (see above)
    sae_id: str | None = Field(
        None, description="The attached SAE to read through (default: the only one attached)."
    )
    features: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Features to watch; null = all."
    )
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = Field(
        None, description=f"Features kept per position (1-{MAX_TOP_K})."
    )  # type: ignore[assignment]  # absent, never null
    positions: PositionWord = Field(None, description="last, prompt, completion (default) or all.")  # type: ignore[arg-type]  # absent, never null
    percentiles: bool = Field(  # type: ignore[assignment]  # absent, never null
        None,
        description="Add each entry's percentile in the SAE's calibration on the model (null when "
        "not calibrated).",
    )
    tokens: bool = Field(  # type: ignore[assignment]  # absent, never null
        None,
        description="Add each position's token: its token_id decoded on its own by the request's "
        "tokenizer (special tokens by name).",
    )
    labels: bool = Field(  # type: ignore[assignment]  # absent, never null
        None,
        description="Add each entry's label: the feature's label in the SAE's labels when the "
        "record is made, null for an unlabelled feature.",
    )
