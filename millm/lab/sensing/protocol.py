"""The bodies that change a cluster's or a circuit's sensing (/api/sensing/{id}/config,
/api/circuit-sensing/{id}/config): fields left out keep their value, null restores the default."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from millm.v1.policy.body_fields import StrictBody

Epsilon = Annotated[float, Field(gt=0, strict=False)]
Floor = Annotated[float, Field(ge=0, strict=False)]
Context = Annotated[int, Field(ge=0, le=64)]


class ClusterSensingConfig(StrictBody):
    """A cluster's sensing: the quorum, the context kept, ε and the floor."""

    min_k: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Members that must fire at one position (null: all sensable ones)."
    )
    context_tokens: Context | None = Field(None, description="Tokens kept each side (0-64).")
    epsilon: Epsilon | None = Field(None, description="θ = ε · max_activation (> 0).")
    theta_floor: Floor | None = Field(None, description="The lowest θ (>= 0).")


class CircuitSensingConfig(StrictBody):
    """A circuit's edge sensing: the lag allowed, the context kept, ε and the floor."""

    max_token_lag: Annotated[int, Field(ge=1, le=64)] | None = Field(
        None, description="The most tokens a downstream feature may fire after its upstream one."
    )
    context_tokens: Context | None = Field(None, description="Tokens kept each side (0-64).")
    epsilon: Epsilon | None = Field(None, description="θ = ε · max_activation (> 0).")
    theta_floor: Floor | None = Field(None, description="The lowest θ (>= 0).")
