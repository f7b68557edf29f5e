"""The llama.cpp runner on the tiny Llama's F32 GGUF file against the lean transformers runner on
the same weights (float32): equal greedy tokens and logits, rows joining a running batch, n
copies, seeds, stops, steering deltas after every block (tests/integration/test_llamacpp_graph.py
reads and operates inside the graph)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from millm.engine.generate import Lane
from millm.engine.jobs import GenerationJob, Ranking, ScoringJob, TokenDrawn
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.engine.scoring import run_scoring
from tests.integration.engine_helpers import Outcome, generate, logits_of, prompt_ids, row

PROMPTS = [
    "The cat",
    "A river runs through the old town and",
    "Once",
    "Seven apples were on the table near the",
]
TOLERANCE = 1e-4


def edit_at(lm, layer: int, seed: int = 3, scale: float = 4.0) -> ResidualEdit:
    generator = torch.Generator().manual_seed(seed)
    return ResidualEdit(((layer, scale * torch.randn(lm.config.hidden_size, generator=generator)),))


def test_the_model_is_described_as_the_file_says(cpp_lm):
    assert cpp_lm.engine == "llama.cpp" and cpp_lm.model is None and cpp_lm.quantization == "F32"
    assert cpp_lm.vocab_size == cpp_lm.tokenizer.vocab_size + 0 or cpp_lm.vocab_size == len(
        cpp_lm.tokenizer
    )
    assert cpp_lm.context_length == 2048 and cpp_lm.config.num_hidden_layers == 3
    assert cpp_lm.system_fingerprint.endswith("float32/F32:llama.cpp")
    assert not cpp_lm.differentiable
    threads = torch.get_num_threads()
    assert cpp_lm.runner.kernels == f"ggml (F32, {threads} threads; graph hooks compiled)"


def test_greedy_tokens_and_logits_equal_the_transformers_runner(cpp_lm, llama_lm):
    prompts = [prompt_ids(cpp_lm, text) for text in PROMPTS]
    # one tokenizer, read from the file
    assert prompts == [prompt_ids(llama_lm, text) for text in PROMPTS]
    gap = (logits_of(cpp_lm, prompts[:1]) - logits_of(llama_lm, prompts[:1])).abs().max().item()
    assert gap < TOLERANCE
    ours = generate(cpp_lm, [row(p, max_tokens=32) for p in prompts])
    theirs = generate(llama_lm, [row(p, max_tokens=32) for p in prompts])
    assert not ours.failed and ours.texts == theirs.texts and ours.tokens == theirs.tokens
    assert cpp_lm.runner.sequences.in_use() == 0  # every sequence left the KV cache with its row


def test_rows_joining_a_running_batch_equal_their_solo_runs(cpp_lm):
    prompts = [prompt_ids(cpp_lm, text) for text in PROMPTS]
    solo = [generate(cpp_lm, [row(p, max_tokens=24)]).texts[0] for p in prompts]
    outcomes = [Outcome() for _ in prompts]
    jobs = [
        GenerationJob(rows=[row(p, max_tokens=24)], emit=o.record)
        for p, o in zip(prompts, outcomes, strict=True)
    ]
    lane = Lane(cpp_lm)
    with torch.inference_mode():
        lane.join(jobs[0], jobs[1])
        for _ in range(5):
            lane.step()
        lane.join(jobs[2])  # midway, beside two running rows
        for _ in range(9):
            lane.step()
        lane.join(jobs[3])
        while lane.rows:
            lane.step()
    assert [o.texts[0] for o in outcomes] == solo


def test_n_copies_seeds_and_stops(cpp_lm):
    prompt = prompt_ids(cpp_lm, "The capital")
    hot = SamplingParams(temperature=1.0)
    first = generate(cpp_lm, [row(prompt, sampling=hot, seed=s) for s in (11, 12)])
    again = generate(cpp_lm, [row(prompt, sampling=hot, seed=s) for s in (11, 12)])
    # one prefill, two sequences
    assert first.texts == again.texts and first.texts[0] != first.texts[1]
    whole = generate(cpp_lm, [row(prompt, max_tokens=24)]).texts[0]
    stop = whole[5:8]
    cut = generate(cpp_lm, [row(prompt, max_tokens=24, stop=[stop])])
    assert cut.texts[0] == whole[: whole.index(stop)] and cut.finish[0] == "stop"


def test_steering_delta_equals_the_transformers_runner(cpp_lm, llama_lm):
    prompts = [prompt_ids(cpp_lm, "The cat")]
    for layer in (0, 1, 2):  # after the first block and after the last too
        edit = edit_at(cpp_lm, layer)
        ours = logits_of(cpp_lm, prompts, edit) - logits_of(cpp_lm, prompts)
        theirs = logits_of(llama_lm, prompts, edit) - logits_of(llama_lm, prompts)
        assert ours.abs().max().item() > 0.1  # the vector moves the answer
        assert (ours - theirs).abs().max().item() < TOLERANCE
    edit = edit_at(cpp_lm, 1)
    steered_ours = generate(cpp_lm, [row(prompts[0], max_tokens=32, edit=edit)])
    steered_theirs = generate(llama_lm, [row(prompts[0], max_tokens=32, edit=edit)])
    assert steered_ours.texts == steered_theirs.texts


def test_steered_and_unsteered_rows_share_a_batch_and_keep_their_own_answers(cpp_lm):
    prompts = [prompt_ids(cpp_lm, text) for text in PROMPTS[:3]]
    edits = [None, edit_at(cpp_lm, 1), edit_at(cpp_lm, 2, seed=5)]
    solo = [
        generate(cpp_lm, [row(p, max_tokens=20, edit=e)]).texts[0]
        for p, e in zip(prompts, edits, strict=True)
    ]
    together = generate(
        cpp_lm, [row(p, max_tokens=20, edit=e) for p, e in zip(prompts, edits, strict=True)]
    )
    assert [together.texts[i] for i in range(3)] == solo
    assert len(set(solo)) == 3


def test_embeddings_and_likelihoods_equal_the_transformers_runner(cpp_lm, llama_lm):
    prompts = [prompt_ids(cpp_lm, text) for text in PROMPTS[:2]]
    ours, mask = cpp_lm.runner.hidden_states(prompts)
    theirs, their_mask = llama_lm.runner.hidden_states(prompts)
    for i, prompt in enumerate(prompts):
        mine = ours[i][mask[i].bool()]
        other = theirs[i][their_mask[i].bool()]
        assert mine.shape == (len(prompt), cpp_lm.config.hidden_size)
        assert (mine - other.float()).abs().max().item() < TOLERANCE
    sequence = prompts[1]
    gap = (
        (cpp_lm.runner.prompt_logits(sequence, 2) - llama_lm.runner.prompt_logits(sequence, 2))
        .abs()
        .max()
        .item()
    )
    assert gap < TOLERANCE


def test_a_cancelled_job_and_a_dropped_batch_give_their_sequences_back(cpp_lm):
    prompt = prompt_ids(cpp_lm, "Once")
    outcome = Outcome()
    job = GenerationJob(rows=[row(prompt, max_tokens=200)] * 2, emit=outcome.record)
    stepped = threading.Event()

    def record(event):
        outcome.record(event)
        stepped.set()
        job.cancelled.set()

    job.emit = record
    from millm.engine.generate import run_job

    assert run_job(cpp_lm, job) == "cancelled"
    logits_of(cpp_lm, [prompt])  # a scoring-style prefill whose batch is dropped at once
    assert cpp_lm.runner.sequences.in_use() == 0


def test_echo_and_generation_logprobs_equal_the_transformers_runner(cpp_lm, llama_lm):
    prompt = prompt_ids(cpp_lm, PROMPTS[0])

    def echoed(lm):
        answers = []
        run_scoring(
            lm,
            ScoringJob(
                prompts=[prompt], emit=answers.append, ranking=Ranking(None, 0.0, 2), echo=True
            ),
        )
        return answers[0].echoed[0]

    ours, theirs = echoed(cpp_lm), echoed(llama_lm)
    assert len(ours.token_logprobs) == len(prompt) - 1
    assert ours.token_logprobs == pytest.approx(theirs.token_logprobs, abs=TOLERANCE)
    assert [[t for t, _ in top] for top in ours.top] == [[t for t, _ in top] for top in theirs.top]

    def drawn(lm):
        outcome = generate(lm, [replace(row(prompt, max_tokens=8), logprobs=2)])
        return [event for event in outcome.events if isinstance(event, TokenDrawn)]

    ours_drawn, theirs_drawn = drawn(cpp_lm), drawn(llama_lm)
    assert [d.token for d in ours_drawn] == [d.token for d in theirs_drawn]
    assert [d.logprob for d in ours_drawn] == pytest.approx(
        [d.logprob for d in theirs_drawn], abs=TOLERANCE
    )
