"""Bodies of the labelling routes: the explaining job's and what it stores, labels from top tokens,
and what an import of labels did."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from millm.formats.labels import LabelDocument
from millm.kernel.books.labels import ImportCounts
from millm.lab.calibration.protocol import CalibrationMessage
from millm.store.explanations import ExplanationRow

MAX_TOP_EXAMPLES = 40  # delphi's n_examples_train
MAX_HELD_OUT = 50  # delphi's n_examples_test
Who = Literal["served", "endpoint", "model"]
SELECTIONS = ("features", "range", "unlabelled", "densest")  # the ways to name the features


class LabelImport(BaseModel):
    """What a PUT or PATCH of labels (or an import, or labelling by top tokens) did."""

    sae_id: str
    format: str  # the document's format, as detected or as forced
    source: str  # what the store records: neuronpedia, mistudio, plain or top_tokens
    imported: int  # labels the document brought
    replaced: (
        int  # PUT: labels stored before (all gone now); PATCH: stored labels the document overwrote
    )
    # entries with an empty label (never stored); by top tokens, features that never fired in the
    # calibration or (overwrite false) kept the label they had
    skipped: int
    total: int  # labels the SAE has now

    @classmethod
    def of(cls, sae_id: str, document: LabelDocument, counts: ImportCounts) -> LabelImport:
        """What storing `document` did, as the API says it."""
        return cls(sae_id=sae_id, format=document.format, source=document.source, **vars(counts))


class TopTokenLabels(BaseModel):
    """Body of POST /api/saes/{id}/labels/top-tokens."""

    model_config = ConfigDict(strict=True, extra="forbid")

    overwrite: bool = Field(
        False,
        description="Label every feature that fired (true), or only those without a label (false).",
    )


class FeatureRange(BaseModel):
    """Features `start` to `end - 1`."""

    model_config = ConfigDict(strict=True, extra="forbid")

    start: Annotated[int, Field(ge=0)]
    end: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _ordered(self) -> FeatureRange:
        if self.end <= self.start:
            raise ValueError("end must be past start")
        return self


def named_with_model(value: str | None, who: str | None, field: str) -> str | None:
    """A `<field>_model` is given with `<field>: "model"`, and only then."""
    if (who == "model") != (value is not None):
        raise ValueError(f'give {field}_model with {field} "model", and only then')
    return value


class ExplainRequest(BaseModel):
    """Which features to explain (exactly one way of naming them), who writes and who scores the
    explanations, how many examples each sees, and the corpus to read them from."""

    model_config = ConfigDict(strict=True, extra="forbid")

    features: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="These features, in this order."
    )
    range: FeatureRange | None = Field(None, description="Features start to end - 1.")
    unlabelled: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="The first N features (by index) that fired in the calibration and have no "
        "label or explanation yet.",
    )
    densest: Annotated[int, Field(ge=1)] | None = Field(
        None, description="The N features that fired most often in the calibration."
    )
    explainer: Who = Field(
        "served",
        description="Who writes each explanation: the served model (unsteered), another "
        "registered model (model: explainer_model, loaded beside the served one for the job), or "
        "the OpenAI-compatible endpoint the operator configured (MILLM_EXPLAINER_BASE_URL).",
    )
    explainer_model: str | None = Field(
        None,
        validate_default=True,
        description='With explainer "model": the registered model that writes.',
    )
    scorer: Who | None = Field(None, description="Who scores them; default: the explainer.")
    scorer_model: str | None = Field(
        None,
        validate_default=True,
        description='With scorer "model": the registered model that scores (default: the '
        "explainer's, when the scorer is left to follow it).",
    )
    top_examples: Annotated[int, Field(ge=1, le=MAX_TOP_EXAMPLES)] = Field(
        20, description="The feature's top windows the explainer reads."
    )
    held_out: Annotated[int, Field(ge=2, le=MAX_HELD_OUT)] = Field(
        20,
        description="Activating windows the scorer is tested on (quantile-sampled, none among the "
        "top ones), and as many quiet ones.",
    )
    quantiles: Annotated[int, Field(ge=1, le=10)] = Field(
        10, description="Activation bins the held-out windows are drawn from."
    )
    width: Annotated[int, Field(ge=4, le=128)] = Field(32, description="Tokens per window.")
    max_tokens: Annotated[int, Field(ge=16, le=1000)] = Field(
        200, description="Most tokens the explainer may write per explanation."
    )
    seed: int = Field(
        22, description="Seeds the held-out draws and the fuzzed marks (delphi's default)."
    )
    answer_start: bool = Field(
        True,
        description="Begin the served explainer's answer with delphi's '[EXPLANATION]:' tag and "
        "take the line it writes (small models seldom write the tag themselves); false asks as "
        "delphi does.",
    )
    score_labels: bool = Field(
        False,
        description="Score each feature's own label (a file's or a user's) the same way instead "
        "of writing an explanation; stored as an explanation by label:<source>, the label "
        "untouched.",
    )
    scoring: list[Literal["detection", "fuzzing"]] = Field(
        ["detection", "fuzzing"],
        min_length=1,
        description="delphi's scores to compute; the first one asked for decides the flag.",
    )
    corpus: Literal["demo"] | None = Field(
        None,
        description='The corpus to read examples from: "demo", or texts and/or conversations; '
        "default: the calibration's when it was the shipped one.",
    )
    texts: list[Annotated[str, Field(min_length=1)]] | None = None
    conversations: list[Annotated[list[CalibrationMessage], Field(min_length=1)]] | None = None

    @field_validator("explainer_model")
    @classmethod
    def _explainer_model_with_model(cls, value: str | None, info: ValidationInfo) -> str | None:
        return named_with_model(value, info.data.get("explainer"), "explainer")

    @field_validator("scorer_model")
    @classmethod
    def _scorer_model_with_model(cls, value: str | None, info: ValidationInfo) -> str | None:
        return named_with_model(value, info.data.get("scorer"), "scorer")

    @property
    def scorer_kind(self) -> tuple[Who, str | None]:
        """Who scores, and which registered model when that is "model" (the explainer's by
        default)."""
        if self.scorer is None:
            return self.explainer, self.explainer_model
        return self.scorer, self.scorer_model

    @property
    def selection(self) -> str:
        """The field that names the features (exactly one does)."""
        return next(k for k in SELECTIONS if getattr(self, k) is not None)

    @model_validator(mode="after")
    def _one_selection(self) -> ExplainRequest:
        named = [k for k in SELECTIONS if getattr(self, k) is not None]
        if len(named) != 1:
            raise ValueError(
                "name the features one way: features, range, unlabelled or densest"
                + (f" (got {', '.join(named)})" if named else "")
            )
        return self


class ExplanationView(BaseModel):
    """A stored explanation of a feature, with its scores and where it came from."""

    feature: int
    explanation: str
    explainer: str
    scorer: str
    prompt_version: str
    detection: dict | None  # BalancedScore's fields; None when not asked for or no text to score
    fuzzing: dict | None  # the same, for fuzzing
    flagged: bool  # balanced accuracy under the server's threshold (kept, marked)
    examples: int  # top windows the explainer read
    created_at: float

    @classmethod
    def of(cls, row: ExplanationRow) -> ExplanationView:
        """A stored row as the API shows it."""
        return cls(
            feature=row.feature,
            explanation=row.explanation,
            explainer=row.explainer,
            scorer=row.detail.get("scorer", ""),
            prompt_version=row.detail.get("prompt_version", ""),
            detection=row.detail.get("detection"),
            fuzzing=row.detail.get("fuzzing"),
            flagged=bool(row.detail.get("flagged", True)),
            examples=int(row.detail.get("examples", 0)),
            created_at=row.created_at,
        )
