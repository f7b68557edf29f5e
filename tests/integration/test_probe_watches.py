"""Probes as engine watches (tiny Llama, a TopK SAE at layer 1): each kind's verdict from a real
generation equals the offline verdict on the residuals the same row captured before the point's
edits, bit for bit, steered or not; and a report watch changes nothing that is generated."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from millm.engine.jobs import ProbeVerdict, ResidualRead, ResidualsRead, Watch
from millm.engine.residual import ResidualEdit
from millm.interp.formats import read_sae
from millm.interp.probes import ModelShape, Scorer, offline_verdict, scorer, watch_of
from millm.interp.steering import Attached
from tests.integration.engine_helpers import generate, prompt_ids, row
from tests.support.tiny_saes import build_saelens

LAYER = 1
BUDGET = 12
PROMPT = "The river runs to the sea and"


@pytest.fixture(scope="module")
def attached(tmp_path_factory) -> dict[str, Attached]:
    info, sae = read_sae(
        build_saelens(
            tmp_path_factory.mktemp("watch-sae") / "sae", layer=LAYER, architecture="topk", seed=31
        )
    )
    return {info.id: Attached(info, sae, LAYER)}


def capture_all(spec, point: int = LAYER):
    """The row, capturing its residual before the point's edits at every position it feeds."""
    return replace(spec, reads=(ResidualRead(point, False, "all", "before"),))


def captured(outcome) -> ResidualsRead:
    return next(e for e in outcome.events if isinstance(e, ResidualsRead) and e.tag == "before")


def verdicts(outcome) -> dict[str, ProbeVerdict]:
    return {e.name: e for e in outcome.events if isinstance(e, ProbeVerdict)}


def split_threshold(scores: torch.Tensor) -> float:
    """A threshold that some positions reach and others do not (the midpoint of a gap near the
    70th percentile)."""
    ordered = sorted(set(scores.tolist()))
    i = int(len(ordered) * 0.7)
    return (ordered[i - 1] + ordered[i]) / 2


def probes(llama_lm, attached, residuals: torch.Tensor, prompt_length: int) -> list[Scorer]:
    """One probe of each kind, with thresholds that split this row's positions."""
    [(sae_id, target)] = attached.items()
    shape = ModelShape(llama_lm.name, residuals.shape[1], 4)
    acts = target.sae.encode(residuals)
    index = int((acts > 0).sum(dim=0).argmax())  # the feature firing at the most positions
    weights = torch.randn(residuals.shape[1], generator=torch.Generator().manual_seed(3)) / 8
    detectors = {
        "feature": {"type": "feature", "sae_id": sae_id, "index": index, "threshold": 1.0},
        "weighted": {
            "type": "weighted",
            "sae_id": sae_id,
            "features": [
                {"index": index, "weight": 1.5},
                {"index": (index + 1) % 128, "weight": -0.5},
            ],
            "threshold": 0.0,
        },
        "linear": {
            "type": "linear",
            "layer": LAYER,
            "hook_point": "resid_post",
            "weights": weights.tolist(),
            "bias": 0.0,
            "threshold": 0.5,
        },
    }
    bound = []
    for name, detector in detectors.items():
        draft = scorer(name, detector, attached, lambda s: None, shape, name)
        threshold = split_threshold(offline_verdict_scores(draft, residuals, prompt_length))
        bound.append(replace(draft, threshold=threshold))
    return bound


def offline_verdict_scores(
    probe: Scorer, residuals: torch.Tensor, prompt_length: int
) -> torch.Tensor:
    parts = [residuals[:prompt_length]] + [
        residuals[p : p + 1] for p in range(prompt_length, residuals.shape[0])
    ]
    return torch.cat([probe.score(part) for part in parts])


@pytest.mark.parametrize("steered", [False, True], ids=["unsteered", "steered-at-the-point"])
def test_each_kinds_verdict_equals_the_offline_verdict_on_the_rows_own_residuals(
    llama_lm, attached, steered
):
    prompt = prompt_ids(llama_lm, PROMPT)
    [(_, target)] = attached.items()
    edit = ResidualEdit(((LAYER, target.sae.direction({3: 6.0, 40: -4.0})),)) if steered else None
    plain = generate(llama_lm, [capture_all(row(prompt, BUDGET, edit=edit))])
    before = captured(plain)
    watched_probes = probes(llama_lm, attached, before.residuals, len(prompt))
    watched = generate(
        llama_lm,
        [
            replace(
                capture_all(row(prompt, BUDGET, edit=edit)),
                watches=tuple(watch_of(p) for p in watched_probes),
            )
        ],
    )

    # a report watch changes nothing generated
    assert watched.texts == plain.texts and watched.finish == plain.finish
    again = captured(watched)
    assert torch.equal(again.residuals, before.residuals)
    got = verdicts(watched)
    assert set(got) == {"feature", "weighted", "linear"}
    for probe in watched_probes:
        want = offline_verdict(
            probe, again.residuals, again.positions, again.token_ids, prompt_length=len(prompt)
        )
        verdict = got[probe.name]
        # the threshold splits the row
        assert verdict.fired and 0 < len(verdict.positions) < len(again.positions), probe.name
        assert (
            verdict.fired,
            verdict.first_position,
            verdict.peak,
            verdict.peak_position,
            verdict.positions,
            verdict.token_ids,
        ) == (
            want.fired,
            want.first_position,
            want.peak,
            want.peak_position,
            want.positions,
            want.token_ids,
        ), probe.name
        assert (verdict.action, verdict.acted_at) == ("report", None)
        # the attention sink is never scored
        assert verdict.peak_position >= 1 and 0 not in verdict.positions


def test_a_watch_leaves_out_the_positions_it_skips(llama_lm):
    """Scores that peak at position 0: skipped, the verdict starts at position 1; not skipped, at
    0."""
    prompt = prompt_ids(llama_lm, PROMPT)
    # largest at a pass's first position
    peaked = lambda h: torch.arange(h.shape[0], 0, -1, dtype=torch.float32)
    for skip, first in ((0, 0), (1, 1)):
        watch = Watch("w", LAYER, peaked, 1.0, "report", skip=skip)
        outcome = generate(llama_lm, [replace(row(prompt, 4), watches=(watch,))])
        verdict = verdicts(outcome)["w"]
        assert (verdict.first_position, verdict.peak_position, verdict.positions[0]) == (
            first,
            first,
            first,
        )
        assert verdict.peak == float(len(prompt) - first)
