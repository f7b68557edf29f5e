"""A probe's detector as pydantic models: a feature against a level, a weighted sum of features, or
a logistic probe on the residual. Probe documents, a request's inline probes and a steering
condition's inline probe define their detector with these."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from millm.formats.document_fields import Document, NonNegative, refusal, said, unique

HookPoint = Literal["resid_post", "resid_pre"]
MAX_WEIGHTED = 64  # features of one weighted detector
MAX_WIDTH = 65_536  # weights of a linear probe (a residual this wide is far past any served model)
# The calibration keeps each feature's firing activations at every whole percent (exactly), so a
# whole percent is a lookup; 0 and 100 would be one corpus's smallest and largest value, the
# extremes of a sample rather than a level of it.
PERCENTILE_RANGE = (1, 99)
PERCENTILE_RULE = (
    "a whole percent from 1 to 99 (a calibration keeps each feature's quantiles at whole percents)"
)

Finite = Annotated[float, Field(allow_inf_nan=False)]


class Strict(Document):
    """A probe document's parts refuse unknown keys: a misspelt hook_point must not pass for the
    default."""

    model_config = ConfigDict(extra="forbid")


class FeatureDetector(Strict):
    """One feature of one SAE against a raw activation or a calibrated percentile (exactly one)."""

    type: Literal["feature"]
    sae_id: Annotated[str, Field(min_length=1)]
    index: NonNegative
    threshold: Annotated[float, Field(gt=0)] | None = (
        None  # an activation is never below 0: 0 would fire everywhere
    )
    percentile: (
        Annotated[int, Field(ge=PERCENTILE_RANGE[0], le=PERCENTILE_RANGE[1]), said(PERCENTILE_RULE)]
        | None
    ) = None

    @model_validator(mode="after")
    def _one_threshold(self) -> FeatureDetector:
        if (self.threshold is None) == (self.percentile is None):
            raise refusal(
                "threshold_or_percentile",
                "give threshold (an activation) or percentile (1-99), not both and not neither",
            )
        return self


class WeightedFeature(Strict):
    """A feature and its weight in a weighted sum."""

    index: NonNegative
    weight: Finite


class WeightedDetector(Strict):
    """Σ weight_i · activation_i over features of one SAE, against `threshold`."""

    type: Literal["weighted"]
    sae_id: Annotated[str, Field(min_length=1)]
    features: Annotated[
        list[WeightedFeature],
        Field(min_length=1, max_length=MAX_WEIGHTED),
        unique(lambda f: f.index, "feature {twice} appears twice"),
    ]
    threshold: Finite


class LinearTraining(Strict):
    """How a linear probe was trained (POST /api/probes/train writes it)."""

    model: Annotated[str, Field(min_length=1)]  # the served model's name its residuals were read on
    positives: NonNegative  # texts of each class
    negatives: NonNegative
    held_out: NonNegative  # texts kept out of the fit, on which the figures below are measured
    # of its verdict per text: fired (at `threshold`) or not
    accuracy: Annotated[float, Field(ge=0, le=1)]
    auc: Annotated[float, Field(ge=0, le=1)] | None = None  # of each text's largest probability
    position_accuracy: Annotated[float, Field(ge=0, le=1)] | None = (
        None  # per position, labelled by its text
    )
    position_auc: Annotated[float, Field(ge=0, le=1)] | None = None
    seed: NonNegative = 0
    trained_at: Finite


class LinearDetector(Strict):
    """sigmoid(w·x + b) on the residual at `layer` (`hook_point`), against `threshold` (a
    probability)."""

    type: Literal["linear"]
    layer: NonNegative
    hook_point: HookPoint = "resid_post"
    weights: Annotated[list[Finite], Field(min_length=1, max_length=MAX_WIDTH)]
    bias: Finite = 0.0
    threshold: Annotated[float, Field(gt=0, lt=1)] = 0.5
    training: LinearTraining | None = None


Detector = Annotated[
    FeatureDetector | WeightedDetector | LinearDetector, Field(discriminator="type")
]
