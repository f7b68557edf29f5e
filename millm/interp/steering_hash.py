"""The canonical hash of an applied steering set, as the original miLLM's `X-miLLM-Steering`
header carries it (`hash="sha256:…"`), so two servers, or a server and a client, can tell whether
they steered with the same values without sending them.

`sha256:` and the lowercase hex SHA-256 of UTF-8 lines, each ending in LF:

    millm.steering-set/v1
    sae=<sae id>
    <index>:<16 lowercase hex digits of the big-endian binary64 strength>   (one per feature)

over the applied strengths (clamped to ±200, as steering applies them), the features whose
strength is zero left out (−0.0 is zero), in ascending index.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from millm.interp.intensity import clamp_strength

HEADER = "millm.steering-set/v1"


def applied_set(features: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """(index, strength) as applied: each strength clamped, zeros dropped, by ascending index."""
    clamped = ((index, clamp_strength(strength)) for index, strength in features)
    return sorted((index, strength) for index, strength in clamped if strength != 0.0)


def steering_set_hash(sae_id: str, features: Iterable[tuple[int, float]]) -> str:
    """`sha256:<hex>` of the applied set of (index, strength) on one SAE."""
    lines = [HEADER, f"sae={sae_id}"]
    lines += [
        f"{index}:{struct.pack('>d', strength).hex()}" for index, strength in applied_set(features)
    ]
    text = "".join(line + "\n" for line in lines)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
