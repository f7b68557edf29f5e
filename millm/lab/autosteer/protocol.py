"""AutoSteer's request and result bodies."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from millm.interp.intensity import STRENGTH_LIMIT

Text = Annotated[str, StringConstraints(min_length=1, max_length=4000)]
Goal = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]
Strength = Annotated[float, Field(ge=-STRENGTH_LIMIT, le=STRENGTH_LIMIT)]
Fraction = Annotated[float, Field(gt=0, le=2)]
DEFAULT_FRACTIONS = (0.1, 0.2, 0.35, 0.5)


class AutoSteerRequest(BaseModel):
    """A plain-language goal, optional examples, and how wide a sweep to run."""

    model_config = ConfigDict(strict=True, extra="forbid")

    goal: Goal = Field(
        description='What the steered model should do, in plain words ("talk like a pirate").'
    )
    sae_id: str | None = Field(
        None, description="The attached SAE to steer through (default: the only one attached)."
    )
    examples: Annotated[list[Text], Field(min_length=1, max_length=32)] | None = Field(
        None,
        description="Texts that show the goal; candidates then also come from contrasting them "
        "with neutral texts.",
    )
    neutral: Annotated[list[Text], Field(min_length=1, max_length=32)] | None = Field(
        None,
        description="Texts without the concept to contrast the examples with (default: a built-in "
        "set).",
    )
    probe_prompts: Annotated[list[Text], Field(min_length=1, max_length=8)] | None = Field(
        None, description="User prompts each setting answers (default: two everyday questions)."
    )
    candidates: Annotated[int, Field(ge=1, le=8)] = Field(
        4, description="Features to find and try."
    )
    include: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=8)] | None = Field(
        None,
        description="Features to try as well, beside those found (to check a hunch against "
        "AutoSteer's picks).",
    )
    strengths: Annotated[list[Strength], Field(min_length=1, max_length=8)] | None = Field(
        None, description="Absolute strengths to sweep (instead of strength_fractions)."
    )
    strength_fractions: Annotated[list[Fraction], Field(min_length=1, max_length=8)] | None = Field(
        None,
        description="Strengths to sweep as fractions of the residual norm at the SAE's layer, "
        f"divided by the feature's decoder norm (default {list(DEFAULT_FRACTIONS)}).",
    )
    max_tokens: Annotated[int, Field(ge=1, le=128)] = Field(
        40, description="Tokens each probe answer may have."
    )
    fluency_tolerance: Annotated[float, Field(ge=0, le=20)] = Field(
        1.0,
        description="How far (nats per token) a setting's fluency may fall below the unsteered "
        "answers' and still count as fluent.",
    )
    rank_by: Literal["affinity", "judge"] = Field(
        "affinity",
        description="Which signal ranks the fluent settings: the affinity (how much likelier the "
        "unsteered model finds the answer when told the goal than when told something neutral), "
        "or the yes/no judge's P(yes). On the demo model the affinity picked the demo profiles' "
        "features and the judge did not (docs/autosteer.md).",
    )
    save_as: (
        Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
        | None
    ) = Field(
        None,
        description="Save the best setting as a profile with this name (only when it beats the "
        "unsteered answers).",
    )

    @model_validator(mode="after")
    def _one_sweep(self) -> AutoSteerRequest:
        if self.strengths is not None and self.strength_fractions is not None:
            raise ValueError("give strengths or strength_fractions, not both")
        if self.neutral is not None and self.examples is None:
            raise ValueError("neutral texts are only used to contrast examples; give examples too")
        return self


class Candidate(BaseModel):
    """A feature AutoSteer tried, and why."""

    index: int
    label: str | None
    source: str  # labels | contrast | given
    # the label search's score, or the contrast's effect size (null: infinite, both sets constant
    # and different)
    evidence: float | None
    decoder_norm: float


class Setting(BaseModel):
    """One feature at one strength, judged."""

    index: int
    label: str | None
    strength: float
    concept: float  # mean P(yes) of the judge over the probe answers
    affinity: (
        float  # mean per-token log-probability gain of the answers when the model is told the goal
    )
    fluency: float  # mean log-probability per token of the answers under the unsteered model
    fluent: bool
    lift: float  # concept minus the unsteered answers' concept
    affinity_lift: float  # affinity minus the unsteered answers' affinity
    samples: list[str]


class Baseline(BaseModel):
    """The unsteered answers, judged the same way."""

    concept: float
    affinity: float
    fluency: float
    samples: list[str]


class AutoSteerResult(BaseModel):
    """Ranked settings with their evidence; `best` is the first fluent setting that beats the
    baseline on `rank_by`."""

    goal: str
    sae_id: str
    layer: int
    residual_norm: float
    judge_prompt: str
    goal_system: str  # the system message that states the goal, for the affinity
    control_system: str  # the neutral one it is compared with
    rank_by: str
    probe_prompts: list[str]
    candidates: list[Candidate]
    baseline: Baseline
    settings: list[Setting]
    best: Setting | None
    saved_profile: dict | None = None
    note: str | None = None
