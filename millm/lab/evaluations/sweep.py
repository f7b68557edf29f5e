"""A request's candidates as the settings an evaluation runs, each resolved now, before the job
starts, so that every refusal is a 400 naming the candidate (`candidates[i]...`).

Steering goes through the server's planner, as a /v1 request's would: a feature or a vector at a
strength is a request's own `steering`; a variant is its plan through an intensity; a profile
its request-scoped plan. The prompting baseline is a system message asking for the concept.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.jobs import Watch
from millm.engine.residual import ResidualEdit
from millm.errors import InvalidRequest, MillmError
from millm.formats.profiles import validate_spec
from millm.interp.intensity import Dial
from millm.interp.steering import check_feature, pick_attached
from millm.kernel.steering.plan import NO_STEERING, Plan
from millm.lab.evaluations.parts import EvaluationParts
from millm.lab.evaluations.protocol import (
    EvaluationRequest,
    FeatureCandidate,
    ProfileCandidate,
    PromptCandidate,
    VariantCandidate,
    VectorCandidate,
)

DEFAULT_SYSTEM = (
    "In every answer, talk about {concept}, while still following the user's instruction."
)


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: what steers it (an edit and its conditions, or a system message)."""

    strength: float | None
    edit: ResidualEdit | None = None
    watches: tuple[Watch, ...] = ()
    system: str | None = None

    @classmethod
    def of(cls, strength: float | None, plan: Plan) -> SweepPoint:
        """The setting a plan steers."""
        return cls(strength, plan.edit, plan.watches)


UNSTEERED = SweepPoint(None)


@dataclass(frozen=True)
class Sweep:
    """A candidate's settings, in the order asked."""

    label: str
    kind: str
    settings: tuple[SweepPoint, ...]


def resolve(state: EvaluationParts, body: EvaluationRequest) -> list[Sweep]:
    """Every candidate's sweep; 400 naming the candidate for one that cannot run on the loaded
    model."""
    sweeps = []
    for i, candidate in enumerate(body.candidates):
        where = f"candidates[{i}]"
        try:
            sweeps.append(_sweep(state, body.concept, candidate, where))
        except MillmError as exc:
            if exc.param and exc.param.startswith(where):
                raise
            raise InvalidRequest(f"{where}: {exc.message}", param=where) from None
    return sweeps


def _sweep(state: EvaluationParts, concept: str, candidate, where: str) -> Sweep:
    planner = state.planner
    if isinstance(candidate, FeatureCandidate):
        attached = pick_attached(state.steering.attached, candidate.sae_id, f"{where}.sae_id")
        check_feature(attached.info, candidate.index, param=f"{where}.index")
        label = state.saes.labels(attached.info.id).get(candidate.index, {}).get("label")
        settings = tuple(
            SweepPoint.of(
                s, planner.plan_for_spec(feature_spec(attached.info.id, candidate.index, s), None)
            )
            for s in candidate.strengths
        )
        name = f"feature {candidate.index}" + (f" ({label})" if label else "")
        return Sweep(name, "feature", settings)
    if isinstance(candidate, VectorCandidate):
        row = state.vectors.find(candidate.vector)
        settings = tuple(
            SweepPoint.of(s, planner.plan_for_spec(vector_spec(row["id"], s), None))
            for s in candidate.strengths
        )
        return Sweep(f"vector {row['name']}", "vector", settings)
    if isinstance(candidate, VariantCandidate):
        variant = state.variants.book.named(candidate.variant)
        if variant is None:
            raise InvalidRequest(
                f"no variant named {candidate.variant!r}", param=f"{where}.variant"
            )
        plans = [
            (x, state.variants.plan(variant, None if x is None else Dial(value=x)))
            for x in dials(candidate.intensities)
        ]
        return Sweep(
            f"variant {variant.name}", "variant", tuple(SweepPoint.of(x, p) for x, p in plans)
        )
    if isinstance(candidate, ProfileCandidate):
        row = state.profiles.find(candidate.profile)
        plans = [
            (x, planner.plan_for(row["id"], None if x is None else Dial(value=x), promised=True))
            for x in dials(candidate.intensities)
        ]
        return Sweep(
            f"profile {row['name']}", "profile", tuple(SweepPoint.of(x, p) for x, p in plans)
        )
    assert isinstance(candidate, PromptCandidate)
    system = (candidate.system or DEFAULT_SYSTEM).replace("{concept}", concept)
    return Sweep("prompting", "prompt", (SweepPoint(None, NO_STEERING.edit, (), system),))


def dials(intensities: list[float] | None) -> list[float | None]:
    """The intensities a sweep goes through; None: the steering's own dial."""
    return list(intensities) if intensities else [None]


def feature_spec(sae_id: str, index: int, strength: float) -> dict:
    """A request's own steering adding one feature at `strength`."""
    entry = {"sae_id": sae_id, "features": [{"index": index, "op": "add", "strength": strength}]}
    return validate_spec({"steering": [entry]})


def vector_spec(vector_id: str, strength: float) -> dict:
    """A request's own steering adding one vector at `strength`."""
    return validate_spec({"vectors": [{"vector_id": vector_id, "op": "add", "strength": strength}]})
