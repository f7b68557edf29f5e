"""Bodies and answers of /api/evaluations: a steering evaluation in AxBench's terms.

A concept, instructions, and candidates to compare in one run (SAE features and steering vectors
at a sweep of strengths, steered variants and profiles at a sweep of intensities, and the
prompting baseline); each candidate's answers are rated for the concept, the instruction and
fluency on AxBench's 0-2 scales, their harmonic mean taken, and their perplexity measured under
the unsteered model.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from millm.interp.intensity import ENVELOPE_MAX, STRENGTH_LIMIT

Text = Annotated[str, StringConstraints(min_length=1, max_length=4000)]
Concept = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]
Strength = Annotated[float, Field(ge=-STRENGTH_LIMIT, le=STRENGTH_LIMIT)]
Intensity = Annotated[float, Field(ge=0, le=ENVELOPE_MAX)]
Strengths = Annotated[list[Strength], Field(min_length=1, max_length=12)]
MAX_CANDIDATES = 12


class Body(BaseModel):
    """Strict parsing; unknown keys are refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


class FeatureCandidate(Body):
    """One SAE feature added at each strength (±200, as every authored strength)."""

    kind: Literal["feature"]
    sae_id: str | None = Field(
        None, description="The attached SAE (default: the only one attached)."
    )
    index: Annotated[int, Field(ge=0)]
    strengths: Strengths


class VectorCandidate(Body):
    """A stored steering vector added at each strength."""

    kind: Literal["vector"]
    vector: str = Field(description="The vector's name or id.")
    strengths: Strengths


class VariantCandidate(Body):
    """A steered variant, through each intensity (default: its own dial)."""

    kind: Literal["variant"]
    variant: str
    intensities: Annotated[list[Intensity], Field(min_length=1, max_length=12)] | None = None


class ProfileCandidate(Body):
    """A saved profile, through each intensity (default: its own strengths)."""

    kind: Literal["profile"]
    profile: str
    intensities: Annotated[list[Intensity], Field(min_length=1, max_length=12)] | None = None


class PromptCandidate(Body):
    """The prompting baseline: the concept asked for in a system message (AxBench's strongest
    method)."""

    kind: Literal["prompt"]
    system: Annotated[str, StringConstraints(min_length=1, max_length=2000)] | None = Field(
        None,
        description="The system message; {concept} stands for the concept (default: a built-in "
        "one).",
    )


Candidate = Annotated[
    FeatureCandidate | VectorCandidate | VariantCandidate | ProfileCandidate | PromptCandidate,
    Field(discriminator="kind"),
]


class EvaluationRequest(Body):
    """POST /api/evaluations."""

    concept: Concept = Field(
        description='What the steering should bring in ("pirates", "the Eiffel Tower").'
    )
    candidates: Annotated[list[Candidate], Field(min_length=1, max_length=MAX_CANDIDATES)]
    instructions: Annotated[list[Text], Field(min_length=1, max_length=50)] | None = Field(
        None, description="User instructions each setting answers (default: six everyday ones)."
    )
    name: Annotated[str, StringConstraints(min_length=1, max_length=120)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=256)] = 48
    judge: Literal["likelihood", "rating", "remote"] = Field(
        "likelihood",
        description="likelihood: the loaded model's likelihoods, unsteered, read as the three "
        "ratings (for models too small to answer a rating question); rating: the loaded model, "
        "unsteered, answering AxBench's rating questions; remote: the OpenAI-compatible judge the "
        "operator configured (MILLM_JUDGE_BASE_URL, MILLM_JUDGE_MODEL) answering them.",
    )


class Sample(BaseModel):
    """One answer and its ratings (0-2), their harmonic mean, and its perplexity under the
    unsteered model."""

    instruction: int  # its index in `instructions`
    text: str
    concept: float
    instruction_score: float
    fluency: float
    harmonic_mean: float
    perplexity: float | None  # None for an empty answer


class Point(BaseModel):
    """One setting (a strength or an intensity; None for a fixed one): the means over its
    answers."""

    strength: float | None
    concept: float
    instruction_score: float
    fluency: float
    harmonic_mean: float
    perplexity: float | None
    samples: list[Sample]


class CandidateResult(BaseModel):
    """A candidate's sweep and its best point (the highest mean harmonic mean)."""

    label: str
    kind: str
    points: list[Point]
    best: Point | None = None


class Ranked(BaseModel):
    """A line of the ranking: a candidate's best point."""

    label: str
    kind: str
    strength: float | None
    harmonic_mean: float
    concept: float
    instruction_score: float
    fluency: float


class EvaluationSummary(BaseModel):
    """A stored evaluation in the list: what it compared and its ranking."""

    id: str
    object: Literal["evaluation"] = "evaluation"
    name: str | None
    concept: str
    model: str
    created_at: float
    complete: bool  # False when the job was cancelled: the points so far
    ranking: list[Ranked]


class EvaluationResult(EvaluationSummary):
    """A stored evaluation whole: also how it was asked and judged, and every point."""

    job_id: str
    judge: dict
    rating_prompts: dict[str, str]
    instructions: list[str]
    max_tokens: int
    baseline: Point | None
    candidates: list[CandidateResult]


class EvaluationList(BaseModel):
    """Every stored evaluation, newest first."""

    object: Literal["list"] = "list"
    data: list[EvaluationSummary]


class EvaluationDeleted(BaseModel):
    """What DELETE answers."""

    id: str
    object: Literal["evaluation"] = "evaluation"
    deleted: Literal[True] = True
