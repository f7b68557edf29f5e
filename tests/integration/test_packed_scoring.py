"""Packed scoring on the tiny Llama: prompts of different lengths share padded passes within the
bounds, each keeps its own next-token logits (float32: equal to a pass alone within 1e-5), the
scheduler packs only a batch's waiting packable lines, and a pack that fails runs its jobs alone."""

from __future__ import annotations

import contextvars
import threading

import torch

from millm.engine.jobs import JobFailed, Ranking, ScoresReady, ScoringJob
from millm.engine.scheduler import Scheduler, background
from millm.engine.scoring import PACK_ROWS, PACK_TOKENS, packs, run_packed, run_scoring
from tests.integration.engine_helpers import prompt_ids
from tests.integration.test_scheduler import gated_job

TEXTS = ["The cat", "A river runs to the sea", "Paris", "Once upon a time there was a king"]


def scoring_job(prompts, pack: bool = True) -> tuple[ScoringJob, list]:
    got: list = []
    return ScoringJob(
        prompts=prompts, emit=got.append, ranking=Ranking(None, 0.0, 3), pack=pack
    ), got


def test_packs_keep_order_and_their_bounds():
    assert packs([5] * 40) == [list(range(0, 16)), list(range(16, 32)), list(range(32, 40))]
    assert max(map(len, packs([3] * 100))) == PACK_ROWS
    wide = PACK_TOKENS // 4
    assert packs([wide, wide, wide, wide, wide, 10]) == [[0, 1, 2, 3], [4, 5]]
    assert packs([]) == []


def test_a_packed_pass_gives_each_prompt_its_own_logits(llama_lm):
    prompts = [prompt_ids(llama_lm, text) for text in TEXTS]
    alone = []
    for prompt in prompts:
        job, got = scoring_job([prompt], pack=False)
        run_scoring(llama_lm, job)
        alone.append(got[0].logits[0])
    jobs = [scoring_job([p]) for p in prompts]
    run_packed(llama_lm, [job for job, _ in jobs])
    for (_, got), expected in zip(jobs, alone, strict=True):
        assert isinstance(got[0], ScoresReady) and got[0].scored[0].chosen == int(expected.argmax())
        assert torch.allclose(got[0].logits[0], expected, atol=1e-5)


def queued_behind_a_running_job(llama_lm, interactive: list, lines: list) -> Scheduler:
    """A scheduler that ran `interactive` jobs, then `lines` as a batch's (background) jobs, all
    submitted while a job held it, so they waited together; it has finished them."""
    scheduler = Scheduler(llama_lm, max_pending=8)
    gate, started = threading.Event(), threading.Event()
    try:
        scheduler.submit(gated_job(llama_lm, gate, started)[0])
        assert started.wait(10)
        for job in interactive:
            scheduler.submit(job)

        def as_background() -> None:
            background.set(True)
            for job in lines:
                scheduler.submit(job)

        contextvars.copy_context().run(as_background)
        gate.set()
        assert scheduler.wait_idle(30)
    finally:
        gate.set()
        scheduler.shutdown(timeout=30)
    return scheduler


def test_the_scheduler_packs_a_batchs_waiting_lines_and_nothing_else(llama_lm):
    prompts = [prompt_ids(llama_lm, text) for text in TEXTS]
    interactive, interactive_got = scoring_job([prompts[0]], pack=False)  # a route's own
    lines = [scoring_job([p]) for p in prompts]
    scheduler = queued_behind_a_running_job(llama_lm, [interactive], [job for job, _ in lines])
    assert interactive_got and all(got for _, got in lines)
    # The interactive job ran alone; the first line entered the queue and took the rest along.
    assert scheduler.packed_jobs == len(lines)


def test_a_pack_that_fails_runs_its_jobs_alone(llama_lm):
    good, good_got = scoring_job([prompt_ids(llama_lm, "Paris")])
    bad, bad_got = scoring_job([[10**6]])  # an id far outside the embedding
    scheduler = queued_behind_a_running_job(llama_lm, [], [bad, good])
    assert good_got and isinstance(good_got[0], ScoresReady)
    assert isinstance(bad_got[0], JobFailed) and bad_got[0].error.code == "generation_failed"
    assert scheduler.packed_jobs == 0
