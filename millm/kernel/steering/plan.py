"""The steering plan a request is admitted with: immutable, so an operator's later change never
reaches a request already running, and a per-request profile can never undo one (plans.py makes
them)."""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.jobs import Watch
from millm.engine.residual import ResidualEdit


@dataclass(frozen=True)
class Plan:
    """What a request is steered by: the engine's edit and the watches of its conditions (each row
    carries both), what it is (X-miLLM-Steering), the resolved dial to echo
    (X-miLLM-Steering-Intensity) and a circuit's rung (X-miLLM-Circuit-Rung)."""

    edit: ResidualEdit | None
    kind: str  # none | live | profile | cluster | circuit | request
    params: tuple[tuple[str, object], ...] = ()
    intensity: float | None = None
    rung: int | None = None
    watches: tuple[Watch, ...] = ()

    @property
    def steers(self) -> bool:
        """Whether anything changes a row: an edit, or a condition that may."""
        return self.edit is not None or bool(self.watches)


NO_STEERING = Plan(None, "none")


def turned_off(reason: str, echo: float | None) -> Plan:
    """A request the dial turned off ("off", 0, or a "min" that resolves to 0): nothing steers,
    X-miLLM-Steering says why, and X-miLLM-Steering-Intensity echoes `echo` (None: not sent)."""
    return Plan(None, "none", (("reason", reason),), intensity=echo)
