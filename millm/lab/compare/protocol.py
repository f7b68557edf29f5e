"""POST /api/compare: one conversation generated under several steering variants; its body, its
answer and its stream events.

A variant is "unsteered", "live" (the steering a /v1 request gets now), or an object naming
exactly one of unsteered, live, profile, features, cluster, circuit, with an optional label and
(for live, profile, cluster and circuit) an intensity, the same dial as steering_intensity.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, field_validator, model_validator

from millm.interp.intensity import ENVELOPE_MAX, STRENGTH_LIMIT
from millm.v1.objects import Usage, WireModel
from millm.v1.policy.body_fields import RowCount, StrictBody
from millm.v1.policy.schema_rules import any_of, sent, when
from millm.v1.serving.protocol import ChatMessage, GenerationFields

MAX_VARIANTS = 8  # rows of one comparison: each is a row of the batch, decoded side by side
MAX_FEATURES = 64  # feature settings of one variant
MAX_LABEL = 200
WORDS = ("unsteered", "live")
DEFAULT_VARIANTS = WORDS  # so a researcher always sees what the model would have said unsteered
KINDS = ("unsteered", "live", "profile", "features", "cluster", "circuit")
DIALLED = ("live", "profile", "cluster", "circuit")  # kinds an intensity applies to

Strength = Annotated[float, Field(ge=-STRENGTH_LIMIT, le=STRENGTH_LIMIT, allow_inf_nan=False)]
Intensity = (
    Annotated[float, Field(ge=0.0, le=ENVELOPE_MAX, allow_inf_nan=False)]
    | Literal["off", "min", "max"]
)
Name = Annotated[str, Field(min_length=1)]


class CompareFeature(StrictBody):
    """One feature's strength: `sae_id` may be left out when one SAE is attached."""

    sae_id: Name | None = None
    index: Annotated[int, Field(ge=0)]
    strength: Strength


class Variant(StrictBody):
    """One steering to generate under: exactly one kind key, an optional label and intensity."""

    unsteered: Literal[True] | None = None
    live: Literal[True] | None = None
    profile: Name | None = None
    features: (
        Annotated[list[CompareFeature], Field(min_length=1, max_length=MAX_FEATURES)] | None
    ) = None
    cluster: Name | None = None
    circuit: Name | None = None
    intensity: Intensity | None = None
    label: Annotated[str, Field(max_length=MAX_LABEL)] | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        named = [kind for kind in KINDS if getattr(self, kind) is not None]
        if len(named) != 1:
            raise ValueError(
                f"a variant names exactly one of {', '.join(KINDS)}; this one names "
                f"{', '.join(named) or 'none'}"
            )
        if self.intensity is not None and named[0] not in DIALLED:
            raise ValueError(
                f"intensity applies to {', '.join(DIALLED)} variants, not to {named[0]}"
            )
        return self

    @property
    def kind(self) -> str:
        """Which of KINDS this variant is."""
        return next(kind for kind in KINDS if getattr(self, kind) is not None)

    @property
    def key(self) -> str | None:
        """The profile, cluster or circuit it names (name or id)."""
        return self.profile or self.cluster or self.circuit


def _word_as_object(value: Any) -> Any:
    # "unsteered" and "live" are short for {"unsteered": true} and {"live": true}.
    if isinstance(value, str):
        if value not in WORDS:
            raise ValueError(
                f"a variant is 'unsteered', 'live' or an object naming one of {', '.join(KINDS)}; "
                f"got {value!r}"
            )
        return {value: True}
    return value


VariantItem = Annotated[Variant, BeforeValidator(_word_as_object)]
# Variant's rules across fields and what `variants` accepts, as JSON Schema (server/openapi.py puts
# them in the served schema).
VARIANT_RULES = [
    {"oneOf": [sent(kind) for kind in KINDS]},
    when(sent("intensity"), any_of(*[sent(kind) for kind in DIALLED])),
]
VARIANTS_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "maxItems": MAX_VARIANTS,
    "default": list(DEFAULT_VARIANTS),
    "items": {"anyOf": [{"enum": list(WORDS)}, {"$ref": "#/components/schemas/Variant"}]},
}


class CompareRequest(GenerationFields):
    """POST /api/compare: a conversation, the sampling fields of a chat completion, and the
    variants."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None  # default: the model the server has loaded
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    variants: Annotated[list[VariantItem], Field(min_length=1, max_length=MAX_VARIANTS)] = Field(
        default_factory=lambda: list(DEFAULT_VARIANTS), validate_default=True
    )

    @property
    def row_count(self) -> RowCount:
        """One conversation, a row per variant."""
        return RowCount(len(self.variants), "variants", "variants")

    @field_validator("variants", mode="before")
    @classmethod
    def _null_is_default(cls, value):
        return list(DEFAULT_VARIANTS) if value is None else value


# ---- the answer ----------------------------------------------------------------------------------


class AppliedFeature(WireModel):
    """A feature strength a variant applied."""

    sae_id: str
    index: int
    strength: float


class AppliedSteering(WireModel):
    """What steered a variant: the kind (none, live, profile, cluster, circuit, features), the
    base's name, the resolved intensity when one was dialled, a circuit's rung, the features set,
    and the remaining parameters X-miLLM-Steering would carry (version, scope, mode, reason)."""

    omit_when_none = frozenset({"name", "intensity", "rung", "features"})
    kind: str
    name: str | None = None
    intensity: float | None = None
    rung: int | None = None
    features: list[AppliedFeature] | None = None
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)


class VariantInfo(WireModel):
    """A variant as resolved: its position, label and steering."""

    index: int
    label: str
    steering: AppliedSteering


class VariantAnswer(VariantInfo):
    """A variant's whole answer."""

    text: str
    finish_reason: str | None
    usage: Usage


class Comparison(WireModel):
    """The non-streamed answer: every variant, and usage over all of them (the prompt counted
    once)."""

    id: str
    object: Literal["compare"] = "compare"
    created: int
    model: str
    seed: int
    variants: list[VariantAnswer]
    usage: Usage


class CompareStart(WireModel):
    """The first stream event: what each variant index is."""

    id: str
    object: Literal["compare.start"] = "compare.start"
    created: int
    model: str
    seed: int
    variants: list[VariantInfo]


class CompareDelta(WireModel):
    """New text of one variant."""

    object: Literal["compare.delta"] = "compare.delta"
    variant: int
    delta: str


class CompareFinish(WireModel):
    """A variant is done: why, and its usage."""

    object: Literal["compare.finish"] = "compare.finish"
    variant: int
    finish_reason: str | None
    usage: Usage


class CompareUsage(WireModel):
    """The last event before [DONE]: usage over every variant (the prompt counted once)."""

    object: Literal["compare.usage"] = "compare.usage"
    usage: Usage
