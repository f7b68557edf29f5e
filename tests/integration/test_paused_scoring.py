"""A batch's scoring line pauses for interactive work, on the tiny Llama: between blocks on the lean
runner, between chunks of tokens on llama.cpp. Its logits are bit for bit a pass alone's, however
often it pauses and whatever steered work runs in the gaps; on both scheduler policies an
interactive job that comes mid-pass is answered first, and the line then finishes where it
stopped."""

from __future__ import annotations

import contextvars
import threading

import pytest
import torch

from millm.engine.background import PausedScoring
from millm.engine.generate import run_job
from millm.engine.jobs import GenerationJob, Ranking, ResidualRead, ScoresReady, ScoringJob
from millm.engine.residual import ResidualEdit
from millm.engine.scheduler import Scheduler, background
from millm.engine.scoring import run_scoring
from tests.integration.engine_helpers import Outcome, logits_of, prompt_ids, row

LINE = "Once upon a time there was a king who lived by the sea and counted the waves"
CHAT = "The cat"


def scoring(prompts, edit=None, reads=(), emit=None, echo=False) -> tuple[ScoringJob, list]:
    got: list = []
    job = ScoringJob(
        prompts=prompts,
        emit=emit or got.append,
        ranking=Ranking(None, 0.0, 3),
        edit=edit,
        reads=reads,
        echo=echo,
    )
    return job, got


def steering(lm, scale: float) -> ResidualEdit:
    """A vector added after every block."""
    d = lm.config.hidden_size
    vector = torch.linspace(-scale, scale, d)
    return ResidualEdit(tuple((point, vector) for point in range(lm.config.num_hidden_layers)))


def alone(lm, prompts, edit=None, reads=(), echo=False) -> ScoresReady:
    job, got = scoring(prompts, edit, reads, echo=echo)
    run_scoring(lm, job)
    return got[0]


@pytest.mark.parametrize(
    ("own_edit", "echo"),
    [(False, False), (True, False), (False, True)],
    ids=["unsteered", "its-own-edit", "echo"],
)
def test_pausing_after_every_block_changes_no_logit(llama_lm, own_edit, echo):
    lm = llama_lm
    prompts = [prompt_ids(lm, LINE), prompt_ids(lm, "A river runs to the sea")]
    edit = steering(lm, 2.0) if own_edit else None
    chat = [prompt_ids(lm, CHAT)]
    gap_edit = steering(lm, 5.0)
    # The work in the gaps is steered: were its hooks left in place, the line's later blocks
    # would be steered by it.
    assert not torch.equal(logits_of(lm, prompts[:1], gap_edit), logits_of(lm, prompts[:1]))
    expected = alone(lm, prompts, edit, echo=echo)
    job, got = scoring(prompts, edit, echo=echo)
    paused = PausedScoring(lm, job, None)
    runs = 1
    while not paused.run(lambda: True, None):
        lm.residual.install(lm.residual.stack([gap_edit]))  # a steered chat's pass, as a lane runs
        lm.runner.prefill(chat, capacity=len(chat[0]) + 1)
        runs += 1
    blocks = lm.config.num_hidden_layers
    assert paused.pauses == runs - 1 == blocks * len(prompts)  # after every block of every pass
    assert torch.equal(got[0].logits[0], expected.logits[0])
    assert torch.equal(got[0].logits[1], expected.logits[1])
    assert got[0].scored == expected.scored
    assert got[0].echoed == expected.echoed and len(got[0].echoed) == (2 if echo else 0)


def chunks_of_3(length: int) -> int:
    count, done = 0, 0
    while done < length:
        done += 4 if length - done == 4 else 3
        count += 1
    return count


@pytest.mark.parametrize("echo", [False, True], ids=["last-token", "echo"])
@pytest.mark.parametrize("chats_between", [False, True], ids=["alone", "chats-between"])
def test_on_llamacpp_a_line_pauses_between_chunks(cpp_lm, echo, chats_between):
    """Chunks of 3 tokens (4 where 3 would leave one for last: a one-token decode runs on other
    kernels) change no logit. A chat run between them may put its KV cells between the line's,
    and llama.cpp sums attention in the order of the cells: the last bits may then move, as they
    do for any row beside others in its shared cache (here within 1e-4)."""
    lm = cpp_lm
    prompts = [prompt_ids(lm, LINE), prompt_ids(lm, "A river runs to the sea")]
    gap_edit = steering(lm, 5.0)
    chat = [prompt_ids(lm, CHAT)]
    assert not torch.allclose(
        logits_of(lm, prompts[:1], gap_edit), logits_of(lm, prompts[:1]), atol=1e-2
    )
    expected = alone(lm, prompts, echo=echo)
    job, got = scoring(prompts, echo=echo)
    paused = PausedScoring(lm, job, None, chunk=lambda: 3)
    while not paused.run(lambda: True, None):
        if chats_between:
            lm.residual.install(lm.residual.stack([gap_edit]))
            lm.runner.prefill(chat, capacity=len(chat[0]) + 1)
    # Echo's pass over the prompt runs whole (it keeps the logits of every position).
    assert paused.pauses == (0 if echo else sum(chunks_of_3(len(p)) - 1 for p in prompts))
    for index in (0, 1):
        difference = float((got[0].logits[index] - expected.logits[index]).abs().max())
        assert difference < 1e-4 if chats_between and not echo else difference == 0.0
    assert [s.chosen for s in got[0].scored] == [s.chosen for s in expected.scored]
    assert got[0].echoed == expected.echoed
    assert lm.runner.sequences.in_use() == 0  # the chunks' sequence left with the line


def test_a_paused_line_keeps_its_reads(llama_lm):
    lm = llama_lm
    prompts = [prompt_ids(lm, LINE)]
    reads = (ResidualRead(1, False, (0, len(prompts[0])), "monitoring"),)
    expected = alone(lm, prompts, reads=reads)
    job, got = scoring(prompts, reads=reads)
    paused = PausedScoring(lm, job, None)
    while not paused.run(lambda: True, None):
        lm.residual.install(lm.residual.stack([steering(lm, 5.0)]))
        lm.runner.prefill([prompt_ids(lm, CHAT)], capacity=8)
    assert torch.equal(got[0].reads[0].residuals, expected.reads[0].residuals)
    assert torch.equal(got[0].logits[0], expected.logits[0])


@pytest.mark.parametrize("batching", [False, True], ids=["serial", "batched"])
def test_interactive_work_coming_mid_pass_is_answered_first(llama_lm, batching):
    """A hook on block 0 submits a steered chat the first time the line's pass reaches it: the
    line pauses after that block, the chat starts, and the line ends as it would alone."""
    lm = llama_lm
    line_prompts = [prompt_ids(lm, LINE)]
    expected = alone(lm, line_prompts)
    chat_alone = Outcome()
    order: list[str] = []
    chat = Outcome()
    chat_done, line_done = threading.Event(), threading.Event()

    def chat_emit(event):
        chat.record(event)
        if chat.finish:
            order.append("chat ended")
            chat_done.set()

    def chat_job(emit) -> GenerationJob:
        return GenerationJob(rows=[row(prompt_ids(lm, CHAT), 6, edit=steering(lm, 3.0))], emit=emit)

    run_job(lm, chat_job(chat_alone.record))
    got: list = []

    def line_emit(event):
        got.append(event)
        # Where the chat is when the line ends: generating in the batch (its prefill done).
        order.append("line" if chat_done.is_set() else f"line beside {scheduler.batch_rows} row")
        line_done.set()

    line, _ = scoring(line_prompts, emit=line_emit)
    scheduler = Scheduler(lm, max_pending=4, batching=batching)
    fired: list[bool] = []

    def submit_the_chat(module, args, output):
        if not fired:
            fired.append(True)
            scheduler.submit(chat_job(chat_emit))

    hook = lm.runner.layout.blocks[0].module.register_forward_hook(submit_the_chat)
    try:

        def as_background() -> None:
            background.set(True)
            scheduler.submit(line)

        contextvars.copy_context().run(as_background)
        assert line_done.wait(30) and chat_done.wait(30)
    finally:
        hook.remove()
        scheduler.shutdown(timeout=30)
    # The chat's prefill never waits for the line; beside running rows the line then gets slices
    # as long as their steps, so with continuous batching it may end before the chat does.
    if batching:
        assert order in (["chat ended", "line"], ["line beside 1 row", "chat ended"])
    else:
        assert order == ["chat ended", "line"]
    assert scheduler.pauses >= 1
    assert chat.texts == chat_alone.texts and chat.finish == {0: "length"}
    assert torch.equal(got[0].logits[0], expected.logits[0])
