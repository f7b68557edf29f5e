"""Every family the lean runner serves, on a tiny random checkpoint of each: the same numbers as
transformers' own forward, rows that join a running batch equal to their solo runs, steering
deltas of exactly Σ s·W_dec, reads equal to an offline encode, scoring unsteered beside a steered
batch. Prompts and generations run past the sliding windows (16 on Gemma 2, 8 on Gemma 3 and
Mistral)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from millm.engine.jobs import (
    EmbeddingJob,
    EmbeddingsReady,
    ResidualRead,
    ResidualsRead,
    RowSpec,
    ScoresReady,
    ScoringJob,
)
from millm.engine.residual import mlp_input
from millm.engine.runner_lean import LeanRunner
from millm.engine.sampling import SamplingParams
from millm.engine.scheduler import Scheduler
from millm.interp.steering import steering_edit
from tests.conftest import load_tiny
from tests.integration.engine_helpers import generate, prompt_ids, row
from tests.integration.test_batching import Watched, submit
from tests.integration.test_steering_engine import attach, residuals
from tests.support import tiny_models

SHORT = "The cat"
LONG = "Seven apples were on the table near the old town and a river runs through it"
STEPS = 24


@pytest.fixture(scope="module", params=sorted(tiny_models.FAMILIES))
def family(request, tiny_dirs, tmp_path_factory):
    """(family name, its tiny checkpoint's directory, the checkpoint loaded through millm)."""
    name = request.param
    if name in tiny_dirs:
        directory = tiny_dirs[name]
    else:
        directory = tiny_models.FAMILIES[name](
            tmp_path_factory.mktemp(name) / f"tiny-{name}", tiny_dirs["tokenizer"]
        )
    return name, directory, load_tiny(directory, tmp_path_factory.mktemp("home"))


def stock(directory):
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


def greedy_run(runner, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """A row alone: its greedy tokens and the logits each was chosen from."""
    batch, logits = runner.prefill([prompt], capacity=len(prompt) + steps)
    tokens, seen = [], []
    for _ in range(steps):
        seen.append(logits[0])
        tokens.append(int(logits[0].argmax()))
        logits = runner.step(batch, torch.tensor([tokens[-1]]))
    return tokens, seen


def test_the_lean_runner_serves_the_family_with_stock_numbers(family):
    name, directory, lm = family
    assert isinstance(lm.runner, LeanRunner) and lm.runner.mergeable
    reference = stock(directory)
    prompts = [prompt_ids(lm, SHORT), prompt_ids(lm, LONG)]
    assert len(prompts[1]) > 16  # past every tiny model's sliding window
    with torch.inference_mode():
        _, logits = lm.runner.prefill(prompts, capacity=64)  # left-padded together
        for index, prompt in enumerate(prompts):
            want = reference(torch.tensor([prompt])).logits[0, -1]
            assert float((logits[index] - want).abs().max()) < 1e-4, (name, index)
            tokens, _ = greedy_run(lm.runner, prompt, STEPS)
            generated = reference.generate(
                torch.tensor([prompt]),
                max_new_tokens=STEPS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            assert tokens == generated[0, len(prompt) :].tolist(), (name, index)
        start = 3
        scored = lm.runner.prompt_logits(prompts[1], start)  # what scoring reads
        want = reference(torch.tensor([prompts[1]])).logits[0, start - 1 : -1]
        assert float((scored - want).abs().max()) < 1e-4


def test_a_row_joining_a_running_batch_equals_its_solo_run(family):
    """Row A decodes alone for a while, row B joins by its own prefill and a merge, then A
    leaves."""
    name, _, lm = family
    runner = lm.runner
    a, b = prompt_ids(lm, LONG), prompt_ids(lm, SHORT)
    with torch.inference_mode():
        solo_a, logits_a = greedy_run(runner, a, STEPS)
        solo_b, logits_b = greedy_run(runner, b, STEPS)
        batch, logits = runner.prefill([a], capacity=len(a) + STEPS)
        got_a, got_b, seen_a, seen_b = [], [], [], []
        for step in range(STEPS + 6):
            if step == 6:  # B joins midway
                joined, logits_joined = runner.prefill([b], capacity=len(b) + STEPS)
                batch = runner.merge(batch, joined, room=STEPS)
                logits = torch.cat([logits, logits_joined])
            if step == STEPS:  # A has its budget: it leaves and B goes on alone
                runner.select_rows(batch, [1])
                logits = logits[1:]
            rows = ([got_a] if step < STEPS else []) + ([got_b] if step >= 6 else [])
            seen = ([seen_a] if step < STEPS else []) + ([seen_b] if step >= 6 else [])
            for index, (tokens, kept) in enumerate(zip(rows, seen, strict=True)):
                kept.append(logits[index])
                tokens.append(int(logits[index].argmax()))
            logits = runner.step(batch, torch.tensor([tokens[-1] for tokens in rows]))
    assert got_a == solo_a and got_b == solo_b, name
    for together, alone in ((seen_a, logits_a), (seen_b, logits_b)):
        assert (
            max(float((x - y).abs().max()) for x, y in zip(together, alone, strict=True)) < 1e-4
        ), name


def test_staggered_jobs_in_the_scheduler_equal_their_solo_runs(family):
    name, _, lm = family
    prompts = [prompt_ids(lm, text) for text in (SHORT, LONG, "Once")]
    budgets = [20, 12, 24]
    solo = [generate(lm, [row(p, n)]).texts[0] for p, n in zip(prompts, budgets, strict=True)]
    scheduler = Scheduler(lm, 64, batching=True, max_batch=8)
    try:
        assert scheduler.backend == "batched"
        jobs = []
        for prompt, budget in zip(prompts, budgets, strict=True):
            jobs.append(submit(scheduler, [row(prompt, budget)]))
            assert jobs[-1].first.wait(30)
        for job in jobs:
            assert job.done.wait(60)
        assert [job.outcome.texts[0] for job in jobs] == solo, name
        assert max(job.peak for job in jobs) >= 2
    finally:
        scheduler.shutdown(timeout=30)


def test_the_steering_delta_is_the_weighted_decoder_sum(family, tmp_path):
    name, _, lm = family
    a, b = attach(tmp_path, "a", layer=0, seed=1), attach(tmp_path, "b", layer=2, seed=2)
    strengths = {a.info.id: {3: 4.0, 9: -2.5}, b.info.id: {7: 6.0}}
    edit = steering_edit(strengths, {a.info.id: a, b.info.id: b})
    only_a = steering_edit({a.info.id: strengths[a.info.id]}, {a.info.id: a})
    prompt = prompt_ids(lm, LONG)
    plain = residuals(lm, prompt, None, [0, 2])
    steered = residuals(lm, prompt, edit, [0, 2])
    expected_a = 4.0 * a.sae.W_dec[3] - 2.5 * a.sae.W_dec[9]
    assert float((steered[0] - plain[0] - expected_a).abs().max()) < 1e-5, name
    after_a = residuals(lm, prompt, only_a, [2])
    assert float((steered[2] - after_a[2] - 6.0 * b.sae.W_dec[7]).abs().max()) < 1e-5, name
    # a's delta travelled on through the blocks
    assert float((steered[2] - plain[2]).abs().max()) > 0.1


def test_reads_equal_an_offline_encode(family, tmp_path):
    """return_sae_activations' read of block 1 = the SAE's encode of transformers' own hidden
    state there."""
    name, directory, lm = family
    target = attach(tmp_path, "read", layer=1, seed=3)
    prompt = prompt_ids(lm, LONG)
    read = ResidualRead(1, False, "all", "activations", encode=target.sae.encode)
    outcome = generate(
        lm, [RowSpec(tuple(prompt), SamplingParams(temperature=0.0), 6, reads=(read,))]
    )
    captured = next(e for e in outcome.events if isinstance(e, ResidualsRead))
    sequence = list(captured.token_ids)
    with torch.inference_mode():
        hidden = stock(directory)(
            torch.tensor([sequence]), output_hidden_states=True
        ).hidden_states[2][0]
    offline = target.sae.encode(hidden[list(captured.positions)])
    # the prompt and every generated token but the last
    assert len(captured.positions) == len(prompt) + 5
    assert float((captured.encoded - offline).abs().max()) < 1e-4, name
    assert int((offline > 0).sum()) > 0


def test_mlp_input_reads_equal_the_stock_mlp_input(family):
    """A read of block 1's MLP input (what a transcoder encodes), prompt and decode steps, equals
    the input transformers' own MLP module receives."""
    name, directory, lm = family
    prompt = prompt_ids(lm, LONG)
    read = ResidualRead(mlp_input(1), False, "all", "mlp-input")
    outcome = generate(
        lm, [RowSpec(tuple(prompt), SamplingParams(temperature=0.0), 6, reads=(read,))]
    )
    captured = next(e for e in outcome.events if isinstance(e, ResidualsRead))
    reference, seen = stock(directory), {}
    block = reference.get_decoder().layers[1] if name != "gpt2" else reference.transformer.h[1]
    block.mlp.register_forward_hook(lambda m, args, out: seen.update(x=args[0][0]))
    with torch.inference_mode():
        reference(torch.tensor([list(captured.token_ids)]))
    want = seen["x"][list(captured.positions)]
    assert len(captured.positions) == len(prompt) + 5
    assert float((captured.residuals - want).abs().max()) < 1e-4, name


def test_scoring_beside_a_steered_batch_stays_unsteered(family, tmp_path):
    name, _, lm = family
    steer = attach(tmp_path, "steer", layer=1, seed=4)
    edit = steering_edit({steer.info.id: {5: 40.0}}, {steer.info.id: steer})
    steered_prompt, scored_prompt = prompt_ids(lm, SHORT), prompt_ids(lm, LONG)
    steered_alone = generate(lm, [row(steered_prompt, 30, edit=edit)]).texts[0]
    scheduler = Scheduler(lm, 8, batching=True, max_batch=8)
    try:
        reference = Watched(scheduler)
        scheduler.submit(ScoringJob(prompts=[scored_prompt], emit=reference.emit))
        assert reference.done.wait(30)
        steered = submit(scheduler, [row(steered_prompt, 30, edit=edit)])
        assert steered.first.wait(30)
        scores, vectors = Watched(scheduler), Watched(scheduler)
        scheduler.submit(ScoringJob(prompts=[scored_prompt], emit=scores.emit))
        scheduler.submit(EmbeddingJob(prompts=[scored_prompt], emit=vectors.emit))
        assert scores.done.wait(30) and vectors.done.wait(30) and steered.done.wait(30)
    finally:
        scheduler.shutdown(timeout=30)
    got = next(e for e in scores.outcome.events if isinstance(e, ScoresReady)).logits[0]
    want = next(e for e in reference.outcome.events if isinstance(e, ScoresReady)).logits[0]
    assert torch.equal(got, want), name
    assert steered.outcome.texts[0] == steered_alone
    assert (
        next(e for e in vectors.outcome.events if isinstance(e, EmbeddingsReady))
        .vectors.isfinite()
        .all()
    )


# the families with sliding-window layers
@pytest.mark.parametrize("family", ["gemma2", "gemma3", "mistral"], indirect=True)
def test_sliding_layers_hold_a_bounded_number_of_columns(family):
    """Sliding-window layers keep at most twice the window, however long a row runs; global layers
    (none in Mistral) keep everything. The tokens stay transformers' own (checked above, past the
    window)."""
    name, _, lm = family
    runner = lm.runner
    prompt = prompt_ids(lm, LONG)
    steps = 4 * runner.window
    with torch.inference_mode():
        batch, logits = runner.prefill(
            [prompt, prompt_ids(lm, SHORT)], capacity=len(prompt) + steps
        )
        for _ in range(steps):
            logits = runner.step(batch, logits.argmax(-1))
    [sliding] = [group for group in batch.kv.groups if group.keep is not None]
    assert [group.length for group in batch.kv.groups if group.keep is None] == (
        [] if name == "mistral" else [len(prompt) + steps]
    )
    assert sliding.keep == runner.window and sliding.keys.shape[3] == 2 * runner.window
    assert (
        batch.kv.length == sliding.dropped + sliding.length == len(prompt) + steps
        and sliding.dropped > 0
    )
