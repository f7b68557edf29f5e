"""AutoSteer's last step: each swept setting's figures beside the unsteered answers', and the
ranking (fluent settings first, then by the chosen signal: the judge or the affinity)."""

from __future__ import annotations

from dataclasses import dataclass

from millm.lab.autosteer.protocol import AutoSteerRequest, Baseline, Candidate, Setting


@dataclass(frozen=True)
class Judged:
    """What the unsteered model says of a setting's answers (None: every answer was empty)."""

    concept: float
    affinity: float | None
    fluency: float | None


def judged_setting(
    candidate: Candidate,
    strength: float,
    texts: list[str],
    judged: Judged,
    baseline: Baseline,
    body: AutoSteerRequest,
) -> Setting:
    """A setting's figures beside the unsteered answers'; empty answers are neither fluent nor
    affine."""
    fluent = (
        judged.fluency is not None and judged.fluency >= baseline.fluency - body.fluency_tolerance
    )
    affinity = judged.affinity if judged.affinity is not None else -1e9
    return Setting(
        index=candidate.index,
        label=candidate.label,
        strength=strength,
        concept=round(judged.concept, 4),
        affinity=round(affinity, 4),
        fluency=round(judged.fluency if judged.fluency is not None else -1e9, 4),
        fluent=fluent,
        lift=round(judged.concept - baseline.concept, 4),
        affinity_lift=round(affinity - baseline.affinity, 4),
        samples=texts,
    )


def lift(setting: Setting, rank_by: str) -> float:
    """How far the setting beats the unsteered answers on the ranking's signal."""
    return setting.lift if rank_by == "judge" else setting.affinity_lift


def rank_settings(settings: list[Setting], rank_by: str = "judge") -> list[Setting]:
    """Fluent settings first, then by the chosen signal, then by fluency (all descending); ties
    keep the sweep's order."""
    return sorted(settings, key=lambda s: (not s.fluent, -lift(s, rank_by), -s.fluency))
