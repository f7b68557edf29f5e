"""The clusters' and circuits' bodies (/api/clusters, /api/circuits)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Intensity(BaseModel):
    """A cluster's or circuit's persistent dial, within [0, max]."""

    model_config = ConfigDict(strict=True, extra="forbid")
    intensity: float


class CircuitActivation(BaseModel):
    """Activating a circuit below rung 2 needs an explicit acknowledgement."""

    model_config = ConfigDict(strict=True, extra="forbid")
    acknowledge_rung: bool = False
    allow_layer_overlap: bool = False  # compose onto layers another active circuit claims


# kind-specific routes come first: "/active" and "/deactivate" must not be read as keys.
