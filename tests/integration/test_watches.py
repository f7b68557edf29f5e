"""Watches in the engine: a probe scored at every position a row feeds, which reports, steers
from the next position, or ends the row (content_filter); each row alone or in a batch."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import pytest
import torch

from millm.engine.jobs import (
    GenerationJob,
    ProbeVerdict,
    ResidualRead,
    ResidualsRead,
    RowFinished,
    Watch,
)
from millm.engine.residual import ResidualEdit
from millm.engine.scheduler import Scheduler
from tests.integration.engine_helpers import Outcome, generate, prompt_ids, row

POINT = 1  # where the watch reads
EDIT_POINT = 2  # where a steer watch's edit adds its vector
PROMPT = "The cat sat on the"
BUDGET = 16


def before_reads(spec, points=(POINT,)):
    """The row, reading its residual before and after the edits of each point at every position."""
    reads = tuple(
        ResidualRead(p, after, "all", f"{p}-{'after' if after else 'before'}")
        for p in points
        for after in (False, True)
    )
    return replace(spec, reads=reads)


def read(outcome, tag, index=0) -> torch.Tensor:
    return next(
        e
        for e in outcome.events
        if isinstance(e, ResidualsRead) and e.row == index and e.tag == tag
    ).residuals


def verdicts(outcome, index=0) -> list[ProbeVerdict]:
    return [e for e in outcome.events if isinstance(e, ProbeVerdict) and e.row == index]


def chunks(prompt_length: int, total: int) -> list[slice]:
    """The positions each forward pass fed: the prompt at once, then one per decode step."""
    return [slice(0, prompt_length)] + [slice(p, p + 1) for p in range(prompt_length, total)]


@dataclass
class Setup:
    """An unwatched run and a direction whose score first passes `threshold` at generated
    position `p`."""

    prompt: list[int]
    plain: Outcome
    u: torch.Tensor
    scores: torch.Tensor
    p: int
    threshold: float

    def score(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.u

    def offline(self, before: torch.Tensor) -> torch.Tensor:
        """The scores the engine computes, forward pass by forward pass (the same shapes: the
        same bits)."""
        return torch.cat(
            [self.score(before[part]) for part in chunks(len(self.prompt), before.shape[0])]
        )

    def watch(self, action="report", threshold=None, **kwargs) -> Watch:
        return Watch(
            "probe",
            POINT,
            self.score,
            self.threshold if threshold is None else threshold,
            action,
            **kwargs,
        )


@pytest.fixture(scope="module")
def setup(llama_lm) -> Setup:
    """A direction for which the first firing falls well inside the generated text (searched
    once)."""
    prompt = prompt_ids(llama_lm, PROMPT)
    plain = generate(llama_lm, [before_reads(row(prompt, BUDGET), (POINT, EDIT_POINT))])
    before = read(plain, f"{POINT}-before")
    for seed in range(200):
        u = torch.randn(before.shape[1], generator=torch.Generator().manual_seed(seed))
        u = u / u.norm()
        scores = before @ u
        p = int(scores.argmax())
        if (
            len(prompt) + 2 <= p <= before.shape[0] - 4
        ):  # a record high after the prompt, with room after it
            gap = float(scores[p] - scores[:p].max())
            if gap > 0.05:
                s = Setup(prompt, plain, u, scores, p, float(scores[p]) - gap / 2)
                s.scores = s.offline(before)
                return s
    raise AssertionError("no direction fires inside the generated text")


def test_watch_rejects_inconsistent_fields():
    edit = ResidualEdit(((0, torch.zeros(4)),))
    with pytest.raises(ValueError):
        Watch("w", 0, torch.sum, 1.0, "steer")  # steer without an edit
    with pytest.raises(ValueError):
        Watch("w", 0, torch.sum, 1.0, "report", edit=edit)
    with pytest.raises(ValueError):
        Watch("w", 0, torch.sum, 1.0, "steer", edit=edit, tokens=0)
    with pytest.raises(ValueError):
        Watch("w", 0, torch.sum, 1.0, "flag")  # type: ignore[arg-type]


def test_a_report_verdict_equals_the_offline_scores_and_changes_nothing(llama_lm, setup):
    threshold = float(setup.scores.median())  # fires at many positions, prompt and completion
    spec = replace(
        before_reads(row(setup.prompt, BUDGET)), watches=(setup.watch("report", threshold),)
    )
    outcome = generate(llama_lm, [spec])
    assert outcome.texts == setup.plain.texts and outcome.finish == {0: "length"}
    assert torch.equal(read(outcome, f"{POINT}-before"), read(setup.plain, f"{POINT}-before"))
    [verdict] = verdicts(outcome)
    fired = [i for i, s in enumerate(setup.scores.tolist()) if s >= threshold]
    tokens = _tokens(outcome)
    assert verdict.fired and verdict.action == "report" and verdict.name == "probe"
    assert verdict.first_position == fired[0] and list(verdict.positions) == fired
    assert list(verdict.token_ids) == [tokens[i] for i in fired]
    assert verdict.peak == float(setup.scores.max()) and verdict.peak_position == int(
        setup.scores.argmax()
    )
    assert verdict.acted_at is None
    # Events end with the verdict, then the reads, then RowFinished.
    kinds = [type(e).__name__ for e in outcome.events if type(e).__name__ != "TextDelta"]
    assert kinds == ["ProbeVerdict", "ResidualsRead", "ResidualsRead", "RowFinished"]


def test_a_report_watch_that_never_fires_says_so(llama_lm, setup):
    spec = row(setup.prompt, BUDGET, edit=None)
    outcome = generate(
        llama_lm, [replace(spec, watches=(setup.watch("report", float(setup.scores.max()) + 1.0),))]
    )
    [verdict] = verdicts(outcome)
    assert (
        not verdict.fired
        and verdict.first_position is None
        and verdict.positions == ()
        and verdict.acted_at is None
    )
    assert verdict.peak == pytest.approx(float(setup.scores.max()), abs=1e-6)


@pytest.mark.parametrize("tokens", [None, 3])
def test_a_steer_watch_steers_from_the_position_after_it_fires(llama_lm, setup, tokens):
    vector = torch.linspace(-6, 6, llama_lm.model.config.hidden_size)
    edit = ResidualEdit(((EDIT_POINT, vector),))
    spec = replace(
        before_reads(row(setup.prompt, BUDGET), (POINT, EDIT_POINT)),
        watches=(setup.watch("steer", edit=edit, tokens=tokens),),
    )
    outcome = generate(llama_lm, [spec])
    p = setup.p
    for tag in (f"{POINT}-before", f"{EDIT_POINT}-before", f"{EDIT_POINT}-after"):
        # Up to the firing position the row is the unwatched row, bit for bit.
        assert torch.equal(read(outcome, tag)[: p + 1], read(setup.plain, tag)[: p + 1])
    before, after = read(outcome, f"{EDIT_POINT}-before"), read(outcome, f"{EDIT_POINT}-after")
    total = before.shape[0]
    end = total if tokens is None else p + 1 + tokens
    assert torch.equal(after[p + 1 : end], before[p + 1 : end] + vector)
    # after the window the row's own edit (none) again
    assert torch.equal(after[end:], before[end:])
    assert torch.equal(after[: p + 1], before[: p + 1])
    # The token sampled from position p's logits is still the unwatched one; what follows is
    # steered.
    generated = len(setup.prompt)
    assert outcome.texts[0] != setup.plain.texts[0]
    plain_tokens = _tokens(setup.plain)
    assert _tokens(outcome)[: p + 2] == plain_tokens[: p + 2]
    [verdict] = verdicts(outcome)
    assert (
        verdict.fired
        and verdict.first_position == p
        and verdict.acted_at == p + 1
        and p + 1 > generated
    )


def test_a_steer_watch_firing_in_the_prompt_steers_from_the_first_generated_position(
    llama_lm, setup
):
    vector = torch.linspace(-6, 6, llama_lm.model.config.hidden_size)
    watch = setup.watch(
        "steer", threshold=float(setup.scores[0]), edit=ResidualEdit(((EDIT_POINT, vector),))
    )
    spec = replace(before_reads(row(setup.prompt, BUDGET), (EDIT_POINT,)), watches=(watch,))
    outcome = generate(llama_lm, [spec])
    n = len(setup.prompt)
    before, after = read(outcome, f"{EDIT_POINT}-before"), read(outcome, f"{EDIT_POINT}-after")
    assert torch.equal(after[:n], before[:n])  # the prompt is computed once, unsteered
    assert torch.equal(after[n:], before[n:] + vector)
    [verdict] = verdicts(outcome)
    assert verdict.first_position == 0 and verdict.acted_at == n


def test_an_abort_watch_ends_the_row_at_the_firing_step(llama_lm, setup):
    spec = row(setup.prompt, BUDGET)
    outcome = generate(llama_lm, [replace(spec, watches=(setup.watch("abort"),))])
    kept = setup.p - len(setup.prompt) + 1  # every token up to and including the one fed at p
    assert outcome.finish == {0: "content_filter"} and outcome.tokens == {0: kept}
    # the trigger token's text stays
    assert outcome.texts[0] == generate(llama_lm, [row(setup.prompt, kept)]).texts[0]
    [verdict] = verdicts(outcome)
    assert verdict.fired and verdict.first_position == setup.p and verdict.acted_at == setup.p
    assert verdict.positions == (setup.p,) and verdict.peak == float(setup.scores[setup.p])


def test_an_abort_watch_firing_in_the_prompt_samples_nothing(llama_lm, setup):
    watch = setup.watch("abort", threshold=float(setup.scores[: len(setup.prompt)].min()))
    outcome = generate(llama_lm, [replace(row(setup.prompt, BUDGET), watches=(watch,))])
    assert (
        outcome.finish == {0: "content_filter"}
        and outcome.tokens == {0: 0}
        and outcome.texts.get(0, "") == ""
    )
    [verdict] = verdicts(outcome)
    assert verdict.first_position == 0 and verdict.acted_at == 0
    assert list(verdict.positions) == list(range(len(setup.prompt)))  # the whole prompt was scored


def test_rows_sharing_a_prefill_keep_their_own_watches(llama_lm, setup):
    base = row(setup.prompt, BUDGET)
    outcome = generate(
        llama_lm,
        [
            replace(base, watches=(setup.watch("abort"),)),
            replace(base, watches=(setup.watch("report"),)),
            base,
        ],
    )
    assert outcome.finish == {0: "content_filter", 1: "length", 2: "length"}
    assert outcome.texts[1] == outcome.texts[2] == setup.plain.texts[0]
    assert [v.action for v in verdicts(outcome, 0)] == ["abort"] and [
        v.action for v in verdicts(outcome, 1)
    ] == ["report"]
    assert verdicts(outcome, 2) == []
    assert (
        verdicts(outcome, 1)[0].first_position == setup.p
        and verdicts(outcome, 1)[0].acted_at is None
    )


def test_watched_and_plain_rows_in_a_continuous_batch_equal_their_solo_runs(llama_lm, setup):
    vector = torch.linspace(-6, 6, llama_lm.model.config.hidden_size)
    steer = setup.watch("steer", edit=ResidualEdit(((EDIT_POINT, vector),)), tokens=4)
    other = prompt_ids(llama_lm, "A river runs through the old town and")
    specs = [
        replace(row(setup.prompt, BUDGET), watches=(steer, setup.watch("report"))),
        row(other, 12),
        replace(row(setup.prompt, BUDGET), watches=(setup.watch("abort"),)),
        row(setup.prompt, 20, edit=ResidualEdit(((POINT, vector / 4),))),
    ]
    solo = [generate(llama_lm, [spec]) for spec in specs]
    scheduler = Scheduler(llama_lm, 16, batching=True, max_batch=8)
    try:
        outcomes = [Outcome() for _ in specs]
        peak = [0]
        done = [
            _done_when_finished(o, lambda: peak.__setitem__(0, max(peak[0], scheduler.batch_rows)))
            for o in outcomes
        ]
        for spec, (emit, started, _) in zip(specs, done, strict=True):
            scheduler.submit(GenerationJob(rows=[spec], emit=emit))
            assert started.wait(30)  # the next job joins a batch already stepping
        for _, _, finished in done:
            assert finished.wait(60)
    finally:
        scheduler.shutdown(timeout=30)
    for alone, batched in zip(solo, outcomes, strict=True):
        assert (
            batched.texts == alone.texts
            and batched.finish == alone.finish
            and batched.tokens == alone.tokens
        )
        for mine, theirs in zip(verdicts(batched), verdicts(alone), strict=True):
            assert (mine.first_position, mine.positions, mine.acted_at, mine.peak_position) == (
                theirs.first_position,
                theirs.positions,
                theirs.acted_at,
                theirs.peak_position,
            )
            # a batch's products have other shapes
            assert mine.peak == pytest.approx(theirs.peak, abs=1e-4)
    assert outcomes[2].finish == {0: "content_filter"}
    # they really shared the batch
    assert scheduler.stats["batched"]["served"] == 4 and peak[0] >= 2


def _done_when_finished(outcome: Outcome, observe):
    """An emit recording into `outcome`, and events set at the row's first event and at its end."""
    started, finished = threading.Event(), threading.Event()

    def emit(event):
        observe()
        outcome.record(event)
        started.set()
        if isinstance(event, RowFinished):
            finished.set()

    return emit, started, finished


def _tokens(outcome) -> list[int]:
    """The row's prompt then generated tokens (fed ones), from its first residual read."""
    return list(next(e for e in outcome.events if isinstance(e, ResidualsRead)).token_ids)
