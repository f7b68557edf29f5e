"""A comparison's variants as steering plans, each resolved as a single /v1 request with that
steering would be, and described for the answer.

- unsteered: no plan at all (what `steering_intensity: 0` gives);
- live: the plan a /v1 request gets now (the active profile, cluster or circuit, else the live
  values, when steering is enabled), through the variant's intensity;
- profile: the request-scoped profile of a /v1 `profile` field, through the intensity;
- cluster, circuit: that document for this request only, whatever is active and whether steering
  is enabled, through the intensity (without one: a cluster's stored intensity, a circuit's
  authored one);
- features: these strengths on the attached SAEs, for this request only (authored strengths, so
  within ±200; each SAE's sum is clamped there as every edit is).

Plans come from the server's planner (and its cache), so a variant equals the single request.
Every refusal names the variant: `variants[i]...`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from millm.engine.residual import ResidualEdit
from millm.errors import InvalidRequest, MillmError
from millm.interp.intensity import Dial, parse_dial
from millm.interp.steering import Attached, check_feature, pick_attached, steering_edit
from millm.kernel.steering.plan import NO_STEERING, Plan
from millm.kernel.steering.plans import Planner
from millm.lab.compare.protocol import (
    AppliedFeature,
    AppliedSteering,
    CompareFeature,
    Variant,
)


@dataclass(frozen=True)
class Resolved:
    """A variant ready to generate: its label, its plan and what the answer says steered it."""

    label: str
    plan: Plan
    steering: AppliedSteering


def find_bases(books: dict, variants: list[Variant]) -> None:
    """404 for a variant naming an unknown profile, cluster or circuit (`books`: kind -> its book;
    memory only, so it runs before any model moves)."""
    for i, variant in enumerate(variants):
        key = variant.key
        if key is not None:
            with naming(i, variant.kind):
                books[variant.kind].find(key)


def resolve_variants(planner: Planner, variants: list[Variant]) -> list[Resolved]:
    """Each variant's plan, in order; the first that cannot steer is a 400/404 naming it."""
    with planner.steering.lock:  # one consistent view of the attachments for feature variants
        attached = dict(planner.steering.attached)
    resolved = []
    for i, variant in enumerate(variants):
        with naming(i, variant.kind):
            resolved.append(resolve_variant(planner, attached, variant, f"variants[{i}]"))
    return resolved


def resolve_variant(
    planner: Planner, attached: dict[str, Attached], variant: Variant, where: str = "variant"
) -> Resolved:
    """One variant's plan and description (its refusals name `where`)."""
    dial = dial_of(variant)
    if variant.unsteered:
        return Resolved(variant.label or "unsteered", NO_STEERING, describe(NO_STEERING))
    if variant.features is not None:
        edit, applied = features_edit(attached, variant.features, f"{where}.features")
        plan = Plan(edit, "features", (("scope", "request"),))
        return Resolved(variant.label or features_label(applied), plan, describe(plan, applied))
    if variant.live:
        plan = planner.plan_for(None, dial)
        return Resolved(variant.label or dialled("live", variant), plan, describe(plan))
    assert variant.key is not None  # the protocol admits exactly one kind
    plan = planner.plan_for_base(variant.kind, variant.key, dial)
    return Resolved(variant.label or dialled(variant.key, variant), plan, describe(plan))


def dial_of(variant: Variant) -> Dial | None:
    """The variant's intensity as the dial steering_intensity would be."""
    return None if variant.intensity is None else parse_dial(variant.intensity)


def features_edit(
    attached: dict[str, Attached], settings: list[CompareFeature], where: str
) -> tuple[ResidualEdit | None, list[AppliedFeature]]:
    """The residual edit of these feature strengths (None when all are 0) and the features as
    applied.

    Each index must fit its SAE's width (400 invalid_feature_index); a feature listed twice is a
    400, since which strength was meant is unknowable.
    """
    strengths: dict[str, dict[int, float]] = {}
    applied = []
    for j, setting in enumerate(settings):
        entry = f"{where}[{j}]"
        target = pick_attached(attached, setting.sae_id, f"{entry}.sae_id")
        index = check_feature(target.info, setting.index, param=f"{entry}.index")
        features = strengths.setdefault(target.info.id, {})
        if index in features:
            raise InvalidRequest(
                f"feature {index} of {target.info.id} is listed twice; list each feature once",
                param=entry,
            )
        features[index] = setting.strength
        applied.append(
            AppliedFeature(sae_id=target.info.id, index=index, strength=setting.strength)
        )
    return steering_edit(strengths, attached), applied


def describe(plan: Plan, features: list[AppliedFeature] | None = None) -> AppliedSteering:
    """What the answer says steered a variant: the plan's kind, name, dial and rung, its other
    parameters."""
    params = dict(plan.params)
    name = params.pop("name", None)
    return AppliedSteering(
        kind=plan.kind,
        name=None if name is None else str(name),
        intensity=plan.intensity,
        rung=plan.rung,
        features=features,
        params={
            key: value
            for key, value in params.items()
            if isinstance(value, (str, int, float, bool))
        },
    )


def features_label(applied: list[AppliedFeature]) -> str:
    """A features variant's default label: "features 1403:+40, 7:-5"."""
    return "features " + ", ".join(f"{f.index}:{f.strength:+g}" for f in applied)


def dialled(name: str, variant: Variant) -> str:
    """A default label: the base's name, with the intensity when one was given."""
    return name if variant.intensity is None else f"{name} @ {variant.intensity}"


@contextmanager
def naming(i: int, kind: str) -> Iterator[None]:
    """Within it, a refusal names variant `i`: its param becomes variants[i].<kind> (unless it
    already names a field of the variant) and its message says which variant."""
    where = f"variants[{i}]"
    try:
        yield
    except MillmError as exc:
        if not (exc.param or "").startswith(where):
            exc.param = f"{where}.{kind}"
        if not exc.message.startswith(where):
            exc.message = f"{where}: {exc.message}"
        raise
