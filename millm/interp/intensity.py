"""The intensity dial λ: parsing a request's steering_intensity and resolving it per base.

Pure rules from the API page's "Intensity coupling" section, each a small function with a
table-driven test:

- Cluster rule (clusters, and profiles or live values, which declare no range): "min"/"max"
  are the declared intensity_range ∩ [0, max], or CLUSTER_INTENSITY_MIN / max without one;
  numeric λ is capped at the maximum, and dialling below the floor is honoured.
- Circuit rule: numeric λ is clamped into the declared range ∩ [circuit min, max] at both
  ends, so 0.1 against [0.5, 1.5] is 0.5; only an exact 0 / "off" goes below the floor; the
  default floor is CIRCUIT_INTENSITY_MIN (0), so without a declared range "min" equals "off".
- Applied strength of a member: clamp(sign · strength · λ, −200, 200), always from the
  authored strength (the dial is absolute, never compounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from millm.errors import InvalidRequest
from millm.formats.document_fields import STRENGTH_LIMIT

ENVELOPE_MAX = 2.0
SYMBOLS = ("off", "min", "max")


# What parse_dial accepts, as JSON Schema (for the served OpenAPI schema).
DIAL_SCHEMA = {
    "anyOf": [{"type": "number", "minimum": 0, "maximum": ENVELOPE_MAX}, {"enum": list(SYMBOLS)}]
}


@dataclass(frozen=True)
class Dial:
    """A parsed steering_intensity: a number in [0, 2], or one of off/min/max."""

    value: float | None = None
    symbol: str | None = None

    @property
    def off(self) -> bool:
        """Exactly 0 or "off": steering is disabled for the request, whatever the base."""
        return self.symbol == "off" or self.value == 0.0


def parse_dial(raw) -> Dial:
    """steering_intensity as sent: a number 0–2 or "off"/"min"/"max"; anything else is a 400."""
    if isinstance(raw, str):
        if raw in SYMBOLS:
            return Dial(symbol=raw)
        raise InvalidRequest(
            f"steering_intensity must be a number from 0 to 2 or one of off, min, max; got {raw!r}",
            param="steering_intensity",
        )
    if (
        isinstance(raw, bool)
        or not isinstance(raw, (int, float))
        or not math.isfinite(raw)
        or not 0 <= raw <= ENVELOPE_MAX
    ):
        raise InvalidRequest(
            f"steering_intensity must be a number from 0 to {ENVELOPE_MAX:g} or one of off, min, "
            f"max; got {raw!r}",
            param="steering_intensity",
        )
    return Dial(value=float(raw))


def declared_bounds(
    declared: tuple[float, float] | None, floor: float, ceiling: float
) -> tuple[float, float]:
    """The usable [lo, hi]: a declared range intersected with [0, ceiling], else [floor,
    ceiling]."""
    if declared is None:
        return min(floor, ceiling), ceiling
    lo = min(max(declared[0], 0.0), ceiling)
    hi = min(max(declared[1], 0.0), ceiling)
    return lo, max(lo, hi)


def dial_lambda(
    dial: Dial,
    declared: tuple[float, float] | None,
    floor: float,
    maximum: float,
    *,
    clamp_low: bool,
) -> float:
    """λ for a dial: symbols to the range's ends, numbers capped at the top, and with `clamp_low`
    raised to the floor too."""
    if dial.off:
        return 0.0
    lo, hi = declared_bounds(declared, floor, maximum)
    if dial.value is None:  # "min" or "max" ("off" is answered above)
        return lo if dial.symbol == "min" else hi
    return min(max(dial.value, lo) if clamp_low else dial.value, hi)


# The spec names the two rules; plans.py reads better saying which one it applies.
def cluster_lambda(
    dial: Dial, declared: tuple[float, float] | None, cluster_min: float, maximum: float
) -> float:
    """λ under the cluster rule: numbers capped above only (dialling below the floor is
    honoured)."""
    return dial_lambda(dial, declared, cluster_min, maximum, clamp_low=False)


def circuit_lambda(
    dial: Dial, declared: tuple[float, float] | None, circuit_min: float, maximum: float
) -> float:
    """λ under the circuit rule: clamped at both ends; only an exact 0 / "off" is below the
    floor."""
    return dial_lambda(dial, declared, circuit_min, maximum, clamp_low=True)


def clamp_strength(value: float) -> float:
    """A strength limited to ±STRENGTH_LIMIT; the one place derived strengths are clamped at
    apply time."""
    return max(-STRENGTH_LIMIT, min(STRENGTH_LIMIT, value))


def applied_strength(strength: float, sign: int, intensity: float) -> float:
    """clamp(sign · strength · λ, −200, 200)."""
    return clamp_strength(sign * strength * intensity)


def echo(value: float) -> str:
    """How a resolved λ is written in X-miLLM-Steering-Intensity (an RFC 8941 decimal)."""
    rounded = round(value, 3)
    return (
        f"{rounded:.3f}".rstrip("0").rstrip(".") if rounded != int(rounded) else f"{int(rounded)}.0"
    )
