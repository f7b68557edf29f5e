"""Continuous batching on tiny models: rows that join a running batch and leave it produce what
they produce alone (greedy, float32), with their own sampling and steering; scoring and
embeddings beside a batch stay unsteered; seeded jobs run on the serial lane."""

from __future__ import annotations

import threading

import pytest
import torch

from millm.engine.jobs import (
    EmbeddingJob,
    EmbeddingsReady,
    GenerationJob,
    JobFailed,
    RowFinished,
    RowSpec,
    ScoresReady,
    ScoringJob,
    TextDelta,
)
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.engine.scheduler import Scheduler
from millm.errors import ModelNotLoaded
from tests.conftest import load_tiny
from tests.integration.engine_helpers import Outcome, generate, prompt_ids, row
from tests.support import tiny_models

PROMPTS = [
    "The cat",
    "A river runs through the old town and",
    "Once",
    "Seven apples were on the table near the",
]


class Watched:
    """A job's outcome plus when it ended, and the largest batch the scheduler had while it ran."""

    def __init__(self, scheduler: Scheduler, rows: int = 1):
        self.outcome, self.done, self.scheduler = Outcome(), threading.Event(), scheduler
        self.open, self.peak, self.first = rows, 0, threading.Event()

    def emit(self, event):
        self.outcome.record(event)
        self.peak = max(self.peak, self.scheduler.batch_rows)
        if isinstance(event, TextDelta):
            self.first.set()
        if isinstance(event, RowFinished):
            self.open -= 1
        if self.open == 0 or isinstance(event, (JobFailed, EmbeddingsReady, ScoresReady)):
            self.done.set()


def submit(scheduler: Scheduler, rows, **kwargs) -> Watched:
    watched = Watched(scheduler, len(rows))
    watched.job = GenerationJob(rows=rows, emit=watched.emit, **kwargs)
    scheduler.submit(watched.job)
    return watched


@pytest.fixture
def batched(request):
    """A batched scheduler over the model named by the test's `lm` parameter, shut down after."""
    schedulers = []

    def make(lm, max_batch=8):
        scheduler = Scheduler(lm, 64, batching=True, max_batch=max_batch)
        schedulers.append(scheduler)
        return scheduler

    yield make
    for scheduler in schedulers:
        scheduler.shutdown(timeout=30)


@pytest.mark.parametrize("model", ["llama_lm"])  # every other family: test_families.py
def test_staggered_joins_equal_solo_runs(model, request, batched):
    lm = request.getfixturevalue(model)
    prompts = [prompt_ids(lm, text) for text in PROMPTS]
    budgets = [14, 9, 20, 6]
    solo = [generate(lm, [row(p, n)]).texts[0] for p, n in zip(prompts, budgets, strict=True)]
    scheduler = batched(lm)
    jobs = []
    for prompt, budget in zip(prompts, budgets, strict=True):
        jobs.append(submit(scheduler, [row(prompt, budget)]))
        assert jobs[-1].first.wait(30)  # the next job joins a batch that is already stepping
    for job in jobs:
        assert job.done.wait(30)
    assert [job.outcome.texts[0] for job in jobs] == solo
    assert [job.outcome.tokens[0] for job in jobs] == budgets
    assert max(job.peak for job in jobs) >= 2  # they really shared the batch
    assert scheduler.wait_idle(5) and scheduler.running_rows == 0
    assert scheduler.stats["batched"]["served"] == 4 and scheduler.stats["serial"]["served"] == 0


def test_per_row_sampling_and_steering_in_one_batch(llama_lm, batched):
    lm = llama_lm
    d = lm.model.config.hidden_size
    edit = ResidualEdit(((1, torch.linspace(-3, 3, d)),))
    hot = SamplingParams(temperature=0.9, top_p=0.8)
    penalised = SamplingParams(temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5)
    specs = [
        row(prompt_ids(lm, "The cat"), 16, edit=edit),
        row(prompt_ids(lm, "The cat"), 16),
        row(prompt_ids(lm, "A river runs"), 16, sampling=hot, seed=11),
        row(prompt_ids(lm, "Once upon"), 16, sampling=penalised),
    ]
    solo = [generate(lm, [spec]).texts[0] for spec in specs]
    assert solo[0] != solo[1]  # the edit changes the text, so the comparison below means something
    scheduler = batched(lm)
    jobs = [submit(scheduler, [spec]) for spec in specs]
    for job in jobs:
        assert job.done.wait(30)
    assert [job.outcome.texts[0] for job in jobs] == solo
    assert scheduler.wait_idle(5)
    assert scheduler.stats["serial"]["served"] == 1  # the seeded row still went to the serial lane
    assert scheduler.stats["batched"]["served"] == 3


def test_n_choices_and_several_rows_join_as_one_job(llama_lm, batched):
    lm = llama_lm
    hot = SamplingParams(temperature=0.8)
    rows = [row(prompt_ids(lm, "The cat"), 10), row(prompt_ids(lm, "A river runs through"), 12)]
    solo = generate(lm, rows).texts
    scheduler = batched(lm)
    first = submit(scheduler, [row(prompt_ids(lm, "Once"), 30, sampling=hot)])
    assert first.first.wait(30)
    both = submit(scheduler, rows)
    assert both.done.wait(30) and first.done.wait(30)
    assert both.outcome.texts == solo and both.outcome.tokens == {0: 10, 1: 12}


def test_cancelling_one_job_leaves_the_others_whole(llama_lm, batched):
    lm = llama_lm
    keep_prompt = prompt_ids(lm, "A river runs through the old town and")
    expected = generate(lm, [row(keep_prompt, 24)]).texts[0]
    scheduler = batched(lm)
    doomed = submit(scheduler, [row(prompt_ids(lm, "The cat"), 60)])
    kept = submit(scheduler, [row(keep_prompt, 24)])
    assert doomed.first.wait(30) and kept.first.wait(30)  # both are in the batch now
    doomed.job.cancel()
    assert kept.done.wait(30)
    assert kept.outcome.texts[0] == expected and kept.outcome.finish == {0: "length"}
    assert scheduler.wait_idle(10)
    assert (
        scheduler.stats["batched"]["cancelled"] == 1 and scheduler.stats["batched"]["served"] == 1
    )
    assert not doomed.outcome.finish  # a cancelled row reports nothing more


def test_a_job_cancelled_while_its_step_runs_is_counted_and_let_go(llama_lm, batched):
    """A client may leave while the scheduler is partway through a step: here while it emits the
    last event of the row before the leaving one, so no row is left after the step. The job still
    ends as `cancelled` and the scheduler goes idle."""
    lm = llama_lm
    keep_prompt = prompt_ids(lm, "A river runs through the old town and")
    expected = generate(lm, [row(keep_prompt, 40)]).texts[0]
    scheduler = batched(lm)
    kept, later = Watched(scheduler), []

    def emit_then_cancel(event):  # runs inside the step, on the row before the doomed one
        kept.emit(event)
        if isinstance(event, RowFinished) and later and later[0].first.is_set():
            later[0].job.cancel()

    kept.job = GenerationJob(rows=[row(keep_prompt, 40)], emit=emit_then_cancel)
    scheduler.submit(kept.job)
    later.append(submit(scheduler, [row(prompt_ids(lm, "The cat"), 60)]))
    assert kept.done.wait(30) and later[0].first.is_set()
    assert kept.outcome.texts[0] == expected
    assert scheduler.wait_idle(10)
    assert scheduler.stats["batched"] == {"served": 1, "cancelled": 1, "failed": 0}
    assert scheduler.batch_rows == 0


def test_scoring_and_embeddings_beside_a_steered_batch_stay_unsteered(llama_lm, batched):
    lm = llama_lm
    d = lm.model.config.hidden_size
    edit = ResidualEdit(((0, torch.linspace(-4, 4, d)),))
    steered_prompt = prompt_ids(lm, "The cat")
    steered_alone = generate(lm, [row(steered_prompt, 40, edit=edit)]).texts[0]
    scored_prompt = prompt_ids(lm, "Seven apples")

    alone = Scheduler(lm, 8)
    try:
        reference_scores, reference_vectors = Watched(alone), Watched(alone)
        alone.submit(ScoringJob(prompts=[scored_prompt], emit=reference_scores.emit))
        alone.submit(EmbeddingJob(prompts=[scored_prompt], emit=reference_vectors.emit))
        assert reference_scores.done.wait(30) and reference_vectors.done.wait(30)
    finally:
        alone.shutdown(timeout=30)

    scheduler = batched(lm)
    steered = submit(scheduler, [row(steered_prompt, 40, edit=edit)])
    assert steered.first.wait(30)
    scores, vectors = Watched(scheduler), Watched(scheduler)
    scheduler.submit(ScoringJob(prompts=[scored_prompt], emit=scores.emit))
    scheduler.submit(EmbeddingJob(prompts=[scored_prompt], emit=vectors.emit))
    assert scores.done.wait(30) and vectors.done.wait(30) and steered.done.wait(30)
    assert steered.peak >= 1 and steered.outcome.tokens[0] == 40  # the batch was running meanwhile
    got = next(e for e in scores.outcome.events if isinstance(e, ScoresReady)).logits[0]
    want = next(e for e in reference_scores.outcome.events if isinstance(e, ScoresReady)).logits[0]
    assert torch.equal(got, want)
    got_v = next(e for e in vectors.outcome.events if isinstance(e, EmbeddingsReady)).vectors
    want_v = next(
        e for e in reference_vectors.outcome.events if isinstance(e, EmbeddingsReady)
    ).vectors
    assert torch.equal(got_v, want_v)
    assert steered.outcome.texts[0] == steered_alone  # and the batch's steered row stayed steered


def test_batch_bound_makes_later_jobs_wait_in_the_queue(llama_lm, batched):
    lm = llama_lm
    scheduler = batched(lm, max_batch=2)
    jobs = [submit(scheduler, [row(prompt_ids(lm, "The cat"), 30)]) for _ in range(4)]
    for job in jobs:
        assert job.done.wait(60)
    assert max(job.peak for job in jobs) == 2
    assert all(job.outcome.tokens == {0: 30} for job in jobs)


def test_models_on_transformers_forward_with_sliding_windows_stay_serial_and_say_why(
    tiny_dirs, tmp_path_factory, batched
):
    """Phi-3 runs on transformers' own forward, whose sliding-window cache layers cannot be
    merged."""
    directory = tiny_models.build_phi3(
        tmp_path_factory.mktemp("phi3") / "tiny-phi3", tiny_dirs["tokenizer"]
    )
    lm = load_tiny(directory, tmp_path_factory.mktemp("home"))
    scheduler = batched(lm)
    assert scheduler.backend == "serial" and "cannot merge" in scheduler.batching_unavailable
    job = submit(scheduler, [row(prompt_ids(lm, "The cat"), 5)])
    assert job.done.wait(30) and scheduler.wait_idle(5) and scheduler.stats["serial"]["served"] == 1


def test_shutdown_with_an_error_answers_running_and_queued_jobs(llama_lm):
    scheduler = Scheduler(llama_lm, 8, batching=True, max_batch=1)
    running = submit(scheduler, [row(prompt_ids(llama_lm, "The cat"), 2000 - 10)])
    queued = submit(scheduler, [row(prompt_ids(llama_lm, "Once"), 5)])
    assert running.first.wait(30)
    scheduler.shutdown(timeout=30, error=ModelNotLoaded("unloading"))
    for job in (running, queued):
        assert job.done.wait(5)
        assert [type(e) for e in job.outcome.failed] == [ModelNotLoaded]
    assert not running.outcome.finish  # nothing follows the failure


@pytest.mark.parametrize("batching", [False, True])
def test_running_the_device_out_of_memory_answers_insufficient_memory_and_serving_goes_on(
    llama_lm, batching
):
    """A budget whose KV buffer cannot be allocated: a real allocator failure, named by device."""
    scheduler = Scheduler(llama_lm, 8, batching=batching)
    try:
        huge = submit(scheduler, [row(prompt_ids(llama_lm, "The cat"), 10**13)])
        assert huge.done.wait(30)
        [failure] = huge.outcome.failed
        assert (failure.status, failure.code, failure.type) == (
            503,
            "insufficient_memory",
            "invalid_request_error",
        )
        assert failure.message.startswith("cpu ran out of memory")
        after = submit(scheduler, [row(prompt_ids(llama_lm, "The cat"), 5)])
        assert after.done.wait(30) and after.outcome.tokens == {0: 5}
    finally:
        scheduler.shutdown(timeout=30)


def test_monitoring_reads_in_a_batch_equal_their_solo_reads(llama_lm, batched):
    """Rows joining a batch at different times read the same residuals they read alone."""
    from millm.engine.jobs import ResidualRead, ResidualsRead

    lm = llama_lm
    read = ResidualRead(1, False, "all", "monitoring")
    specs = [
        RowSpec(
            tuple(prompt_ids(lm, "The cat")), SamplingParams(temperature=0.0), 12, reads=(read,)
        ),
        RowSpec(
            tuple(prompt_ids(lm, "A river runs through the old town and")),
            SamplingParams(temperature=0.0),
            8,
            reads=(read,),
        ),
    ]

    def captured(outcome):
        return next(e for e in outcome.events if isinstance(e, ResidualsRead))

    solo = [captured(generate(lm, [spec])) for spec in specs]
    scheduler = batched(lm)
    first = submit(scheduler, [specs[0]])
    assert first.first.wait(30)
    second = submit(scheduler, [specs[1]])
    assert first.done.wait(30) and second.done.wait(30)
    assert max(first.peak, second.peak) == 2
    for job, alone in zip((first, second), solo, strict=True):
        together = captured(job.outcome)
        assert together.positions == alone.positions == tuple(range(len(alone.token_ids)))
        assert together.token_ids == alone.token_ids
        torch.testing.assert_close(together.residuals, alone.residuals, rtol=1e-5, atol=1e-5)
