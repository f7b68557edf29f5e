"""A finished row's sensing events as records: a cluster's co-activations, a circuit's edge
observations, each with its phase, the ±K tokens around it and a one-line summary.

Runs on the sensing worker's thread over plain lists (interp/sensing.py says why); decoding
context is the tokenizer's, special tokens skipped. A record is what GET /api/sensing/events
gives back.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from millm.interp.sensing import CoActivation, co_activations, edge_observations
from millm.kernel.sensing.arming import CircuitArm, ClusterArm, EdgeArm, Layer

SUMMARY_CHARS = 300
Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class RowRead:
    """What a row fed the model at every position and the features kept there, per read point."""

    request_id: str
    row: int
    prompt_length: int
    token_ids: list[int]  # at positions 0..n-1
    acts: dict[tuple[int, str], list[list[float]]]  # (point, SAE) -> [position][feature read]
    positions: list[int]
    features: dict[tuple[int, str], tuple[int, ...]]  # (point, SAE) -> the features read there

    def columns(self, layer: Layer, wanted: Sequence[int]) -> list[list[float]]:
        """The activations of `wanted` features of one read layer, [position][feature]."""
        key = (layer.point, layer.sae_id)
        index = [self.features[key].index(f) for f in wanted]
        return [[row[i] for i in index] for row in self.acts[key]]


def event_id() -> str:
    """A sensing event's id."""
    return "sense_" + secrets.token_hex(10)


def context(ids: list[int], start: int, end: int, k: int, decode: Decode) -> dict:
    """±k tokens around positions start..end: the text, its ids and its three parts (empty when
    k is 0 or the span is past the ids the row fed)."""
    if k == 0 or end >= len(ids):
        return {"context_text": None, "context_token_ids": None, "context_parts": None}
    first, last = max(0, start - k), min(len(ids), end + 1 + k)
    text = decode(ids[first:last])
    before = decode(ids[first:start])
    through = decode(ids[first : end + 1])
    span = through[len(before) :] if through.startswith(before) else decode(ids[start : end + 1])
    after = text[len(before) + len(span) :] if text.startswith(before + span) else ""
    return {
        "context_text": text,
        "context_token_ids": ids[first:last],
        "context_parts": {"before": before, "span": span, "after": after},
    }


def _phase(position: int, prompt_length: int) -> str:
    return "prefill" if position < prompt_length else "decode"


def _summary(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def cluster_records(
    arm: ClusterArm, read: RowRead, cap: int, decode: Decode, reported: int = 0
) -> list[dict]:
    """The cluster's events of one row, those ending before position `reported` left out (a
    resent conversation's prefix, reported by the request before)."""
    acts = read.columns(arm.read, arm.read.features)
    found = co_activations(acts, read.positions, arm.read.features, arm.thetas, arm.min_k, cap)
    now = time.time()
    # a microsecond apart, in position order: "newest first" lists a row's later events first
    kept = [event for event in found if event.pos_end >= reported]
    return [
        _cluster_record(arm, read, event, decode, now + i * 1e-6) for i, event in enumerate(kept)
    ]


def _cluster_record(
    arm: ClusterArm, read: RowRead, event: CoActivation, decode: Decode, now: float
) -> dict:
    around = context(read.token_ids, event.pos_start, event.pos_end, arm.context_tokens, decode)
    span = (around["context_parts"] or {}).get("span")
    said = f"{event.fired_count} of {len(arm.thetas)} members of {arm.name!r} fired together"
    said += f" at positions {event.pos_start}-{event.pos_end}"
    return {
        "id": event_id(),
        "kind": "cluster",
        "base_id": arm.base_id,
        "cluster": {"id": arm.base_id, "name": arm.name},
        "request_id": read.request_id,
        "row": read.row,
        "created_at": now,
        "phase": _phase(event.pos_start, read.prompt_length),
        "layer": arm.read.layer,
        "pos_start": event.pos_start,
        "pos_end": event.pos_end,
        "fired_members": [[index, peak] for index, peak in event.fired_members],
        "fired_count": event.fired_count,
        "score": event.score,
        "ambient_fired_count": None,
        "truncated": event.truncated,
        **around,
        "summary": _summary(said + (f": {span!r}" if span else "")),
    }


def edge_records(
    arm: CircuitArm, read: RowRead, cap: int, decode: Decode
) -> tuple[list[dict], set[int]]:
    """The circuit's edge observations of one row, at most `cap` over all its edges (by the
    downstream position; the last kept says truncated when more were seen), and the downstream
    layers that dropped any."""
    seen = []
    for edge in arm.edges:
        up = _column(arm, read, edge.up.layer, edge.up.feature_idx)
        down = _column(arm, read, edge.down.layer, edge.down.feature_idx)
        for observed in edge_observations(
            up, edge.up.theta, down, edge.down.theta, read.positions, arm.max_token_lag
        ):
            seen.append((observed.down_pos, edge.key, edge, observed))
    seen.sort(key=lambda item: (item[0], item[1]))
    kept, dropped = seen[:cap], seen[cap:]
    now = time.time()
    records = [
        _edge_record(arm, read, edge, observed, decode, now + i * 1e-6)
        for i, (_, _, edge, observed) in enumerate(kept)
    ]
    if dropped and records:
        records[-1]["truncated"] = True
    return records, {edge.down.layer for _, _, edge, _ in dropped}


def _column(arm: CircuitArm, read: RowRead, layer: int, feature: int) -> Sequence[float]:
    where = next(r for r in arm.reads if r.layer == layer)
    return [row[0] for row in read.columns(where, [feature])]


def _edge_record(
    arm: CircuitArm, read: RowRead, edge: EdgeArm, observed, decode: Decode, now: float
) -> dict:
    around = context(read.token_ids, observed.up_pos, observed.down_pos, arm.context_tokens, decode)
    said = (
        f"{edge.key} observed ({edge.language}): feature {edge.up.feature_idx} at position "
        f"{observed.up_pos}, then {edge.down.feature_idx} {observed.token_lag} tokens later"
    )
    return {
        "id": event_id(),
        "kind": "circuit",
        "base_id": arm.base_id,
        "circuit": {"id": arm.base_id, "name": arm.name},
        "request_id": read.request_id,
        "row": read.row,
        "created_at": now,
        "edge_key": edge.key,
        "phase": _phase(observed.down_pos, read.prompt_length),
        "up": {
            "layer": edge.up.layer,
            "feature_idx": edge.up.feature_idx,
            "pos": observed.up_pos,
            "act": observed.up_act,
        },  # fmt: skip
        "down": {
            "layer": edge.down.layer,
            "feature_idx": edge.down.feature_idx,
            "pos": observed.down_pos,
            "act": observed.down_act,
        },  # fmt: skip
        "token_lag": observed.token_lag,
        "edge_rung": edge.rung,
        "edge_rung_language": edge.language,  # as of the observation: it never raises a rung
        "ambient_fired_count": None,
        "truncated": False,
        **around,
        # the rung's own words: "causal" only where the edge was validated causally (rung 2+)
        "summary": _summary(said),
    }


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two rows share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
