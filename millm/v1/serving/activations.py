"""Per-request SAE activations (`return_sae_activations`): what a request may read, and its answer.

`plan_read` checks a request's read against the attached SAEs and the spec's limits before
anything is generated; the engine captures the residuals at the SAE's point (before or after
that point's steering delta); `activations_block` encodes them with the SAE's own activation
function, in chunks, and keeps the top_k features per position. Beyond the spec, and only when
asked (`tokens`, `labels`), each position says its token's text and each entry its feature's
label, so the default block keeps the spec's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

from millm.engine.jobs import PositionWord, ResidualRead, ResidualsRead
from millm.errors import InvalidRequest
from millm.formats.document_fields import Indices, NonNegative, refusal, refused_under, said
from millm.interp.calibration_stats import PercentileTable
from millm.interp.sae_reads import encode_rows
from millm.interp.steering import Attached, check_feature, pick_attached
from millm.kernel.books.calibrations import add_percentiles, percentiles_block
from millm.kernel.books.labels import labelled
from millm.v1.policy.request_rules import READ_PARAM, refused_read

ReadPoint = Literal["post_steering", "pre_steering"]
NOTES = {
    "post_steering": (
        "post_steering is what the model computed at this layer for this request, after this "
        "layer's steering delta; it is not an unsteered counterfactual: steering at earlier "
        "layers and tokens generated under steering still shape the residual here."
    ),
    "pre_steering": (
        "pre_steering is the residual before this layer's own steering delta; it is not an "
        "unsteered counterfactual either: steering at earlier layers and tokens generated under "
        "steering still shape the residual here."
    ),
}


@dataclass(frozen=True)
class ActivationRead:
    """A checked read: the SAE, the candidate features, how many to keep, where and which side."""

    attached: Attached
    features: tuple[int, ...] | None
    top_k: int
    positions: PositionWord | tuple[int, int]
    read_point: ReadPoint
    percentiles: bool = False  # each entry's percentile asked for
    table: PercentileTable | None = None  # the SAE's calibration on this model, when there is one
    words: Callable[[int], str] | None = None  # a token id's text, when `tokens` was asked for
    labels_asked: bool = False
    # The SAE's labels (index -> entry with "label") as they were when the request started; read
    # from the store off the event loop (`with_labels`), so None until then.
    labels: Mapping[int, dict] | None = None

    def engine_read(self) -> ResidualRead:
        """What the engine captures for it (and encodes, on its own thread)."""
        return ResidualRead(
            self.attached.read_point,
            self.read_point == "post_steering",
            self.positions,
            "activations",
            encode=self.encode,
        )

    def encode(self, residuals: torch.Tensor) -> list[list[dict]]:
        """Top features of each captured position (with their percentiles when asked)."""
        rows = encode_rows(self.attached.sae, residuals, self.features, self.top_k)
        return add_percentiles(rows, self.table) if self.percentiles else rows

    def with_labels(self, labels: Mapping[int, dict]) -> ActivationRead:
        """The same read holding the SAE's labels (`labels` asked for)."""
        return replace(self, labels=labels)


def worst_case_positions(
    positions: PositionWord | tuple[int, int], prompt_tokens: int, max_tokens: int
) -> int:
    """Positions a read may return at most, counting max_tokens in full (the spec's rule)."""
    if positions == "last":
        return 1
    if positions == "prompt":
        return prompt_tokens
    if positions == "completion":
        return max_tokens
    if positions == "all":
        return prompt_tokens + max_tokens
    start, end = positions
    return end - start


class PositionRange(BaseModel):
    """A half-open range of absolute positions, over prompt then generated tokens."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    start: NonNegative
    end: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _ordered(self) -> PositionRange:
        if self.end <= self.start:
            raise refusal(
                "range_order",
                "0 <= start < end, got start {start} and end {end}",
                start=self.start,
                end=self.end,
            )
        return self


Positions = Annotated[
    Annotated[
        PositionWord, said('one of last, prompt, completion, all or {"start", "end"}'), Tag("word")
    ]
    | Annotated[PositionRange, Tag("range")],
    Discriminator(lambda value: "range" if isinstance(value, (dict, PositionRange)) else "word"),
]


class ReadRequest(BaseModel):
    """What to read: an attached SAE, candidate features, top_k per position, positions and read
    point."""

    # Parsed before any model is held (its syntax is the request's alone); plan_read binds it to an
    # SAE.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    sae_id: str | None = None
    features: Annotated[Indices, Field(min_length=1)] | None = None
    top_k: Annotated[int, Field(ge=1)] = 8
    positions: Positions = "completion"
    read_point: ReadPoint = "post_steering"
    percentiles: bool = Field(
        False,
        description="Add each entry's percentile among the feature's firing activations in the "
        "SAE's calibration on this model (null when not calibrated).",
    )
    tokens: bool = Field(
        False,
        description="Add each position's token: the text of its token_id decoded on its own "
        "(special tokens by name).",
    )
    labels: bool = Field(
        False,
        description="Add each entry's label: the feature's label in the SAE's labels, null for an "
        "unlabelled feature.",
    )

    @property
    def span(self) -> PositionWord | tuple[int, int]:
        """The positions as the engine takes them: a word, or (start, end)."""
        return (
            self.positions
            if isinstance(self.positions, str)
            else (self.positions.start, self.positions.end)
        )


# The request field: parsed with the body, refused in this format's words (locations under
# READ_PARAM).
SaeRead = Annotated[ReadRequest, refused_under(READ_PARAM)]


def within_top_k(asked: ReadRequest, limit: int) -> ReadRequest:
    """The read, if its top_k is within SAE_ACTIVATIONS_MAX_TOP_K (a server setting, so checked
    after the body is parsed; the served schema states it too)."""
    if asked.top_k > limit:
        where = f"{READ_PARAM}.top_k"
        raise InvalidRequest(
            f"{where}: at most SAE_ACTIVATIONS_MAX_TOP_K ({limit}), got {asked.top_k}", param=where
        )
    return asked


def plan_read(
    asked: ReadRequest,
    attached: dict[str, Attached],
    *,
    prompt_tokens: int,
    max_tokens: int,
    max_entries: int,
    calibration: Callable[[str], PercentileTable | None] | None = None,
    words: Callable[[int], str] | None = None,
) -> ActivationRead:
    """Bind a parsed read to an attached SAE and check its size before anything runs (400 naming
    what is wrong); `calibration` gives an SAE's percentile table on this model, for `percentiles`;
    `words` a token id's text, for `tokens`."""
    chosen = pick_attached(attached, asked.sae_id, READ_PARAM, prefix=f"{READ_PARAM}: ")
    features = (
        None
        if asked.features is None
        else tuple(
            check_feature(chosen.info, i, param=f"{READ_PARAM}.features") for i in asked.features
        )
    )
    worst = worst_case_positions(asked.span, prompt_tokens, max_tokens) * asked.top_k
    if worst > max_entries:
        raise refused_read(
            f"up to {worst} entries (positions x top_k, counting max_tokens in full) is over "
            f"SAE_ACTIVATIONS_MAX_ENTRIES ({max_entries}); narrow positions, top_k or max_tokens"
        )
    table = calibration(chosen.info.id) if asked.percentiles and calibration is not None else None
    return ActivationRead(
        chosen,
        features,
        asked.top_k,
        asked.span,
        asked.read_point,
        asked.percentiles,
        table,
        words if asked.tokens else None,
        asked.labels,
    )


def activations_block(
    read: ActivationRead, captured: ResidualsRead, *, unsteered: bool = False
) -> dict:
    """The response's `millm.sae_activations` object (from the engine's encode of the capture)."""
    per_position = captured.encoded
    if read.labels_asked:
        per_position = [labelled(features, read.labels or {}) for features in per_position]
    # a token repeated in the read is decoded once
    texts = None if read.words is None else {t: read.words(t) for t in set(captured.token_ids)}
    block = {
        "sae_id": read.attached.info.id,
        "layer": read.attached.layer,
        "read_point": "unsteered" if unsteered else read.read_point,
        "positions": [
            {
                "position": position,
                "token_id": token_id,
                **({} if texts is None else {"token": texts[token_id]}),
                "features": features,
            }
            for position, token_id, features in zip(
                captured.positions, captured.token_ids, per_position, strict=True
            )
        ],
        "note": NOTES[read.read_point]
        if not unsteered
        else (
            "a scoring pass is never steered: this is the unsteered model's residual at this layer."
        ),
    }
    if read.percentiles:
        block["percentiles"] = percentiles_block(read.attached.info.id, read.table)
    return block
