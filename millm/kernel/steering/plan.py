"""The steering plan a request is admitted with: immutable, so an operator's later change never
reaches a request already running, and a per-request profile can never undo one (plans.py makes
them)."""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.jobs import Watch
from millm.engine.residual import ResidualEdit
from millm.interp.intensity import Dial
from millm.interp.steering_hash import AppliedSet


@dataclass(frozen=True)
class Plan:
    """What a request is steered by: the engine's edit and the watches of its conditions (each row
    carries both), what it is (X-miLLM-Steering), the resolved dial to echo
    (X-miLLM-Steering-Intensity) and a circuit's rung (X-miLLM-Circuit-Rung).

    `applied` is what it steers with per SAE (and vector), `aborts` the probes that end its rows,
    `level` the λ its strengths were scaled by (1.0 unscaled), `base_id` the circuit's id,
    `epoch` the steering state it was resolved in, and for circuits active together each one's
    plan in `parts` (statement.py says from these what steered)."""

    edit: ResidualEdit | None
    kind: str  # none | live | profile | cluster | circuit | request
    params: tuple[tuple[str, object], ...] = ()
    intensity: float | None = None
    rung: int | None = None
    watches: tuple[Watch, ...] = ()
    applied: tuple[AppliedSet, ...] = ()
    aborts: tuple[str, ...] = ()
    level: float = 1.0
    base_id: str | None = None
    epoch: tuple[int, ...] | None = None
    parts: tuple[Plan, ...] = ()  # several circuits active together: each one's own plan
    composed: bool = False  # a circuit sharing a layer with another active one

    @property
    def steers(self) -> bool:
        """Whether anything changes a row: an edit, or a condition that may."""
        return self.edit is not None or bool(self.watches)


NO_STEERING = Plan(None, "none")


def turned_off(reason: str, echo: float | None) -> Plan:
    """A request the dial turned off ("off", 0, or a "min" that resolves to 0): nothing steers,
    X-miLLM-Steering says why, and X-miLLM-Steering-Intensity echoes `echo` (None: not sent)."""
    return Plan(None, "none", (("reason", reason),), intensity=echo)


def unsteered(dial: Dial | None, intensity: float) -> Plan:
    """A base that steers nothing through this dial; where the dial itself resolved to 0 ("min"
    without a declared range, under the circuit rule), said and echoed as "off" is."""
    if dial is None or intensity != 0.0:
        return NO_STEERING
    said = dial.symbol if dial.symbol is not None else f"{dial.value:g}"
    return turned_off(f"steering_intensity {said} is 0", 0.0)
