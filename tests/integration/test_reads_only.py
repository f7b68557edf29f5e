"""A reads-only scoring job (discovery reads that keep only their summaries) stops each forward
pass once its reads are taken: the residuals it reads equal a whole pass's, and the blocks after
the read point never run (counted by a forward hook on the tiny Llama's last block)."""

from __future__ import annotations

import torch

from millm.engine.jobs import ResidualRead, ScoresReady, ScoringJob
from millm.engine.residual import decoder_layers
from millm.engine.scoring import run_scoring
from tests.integration.engine_helpers import prompt_ids

TEXTS = ("A river runs through the old town", "Paris is the city of France, they say")


def scored(lm, points: tuple[int, ...], reads_only: bool) -> tuple[ScoresReady, int]:
    """The job's answer, and how many times the model's last block ran."""
    ran = []
    last = decoder_layers(lm.model)[-1]
    handle = last.register_forward_hook(lambda module, args, output: ran.append(1))
    try:
        answers: list[ScoresReady] = []
        job = ScoringJob(
            prompts=[prompt_ids(lm, text) for text in TEXTS],
            emit=answers.append,
            reads=tuple(ResidualRead(p, True, "prompt", "discovery") for p in points),
            reads_only=reads_only,
        )
        run_scoring(lm, job)
    finally:
        handle.remove()
    return answers[0], len(ran)


def test_a_reads_only_pass_stops_after_its_reads_and_reads_the_same_residuals(llama_lm):
    assert len(decoder_layers(llama_lm.model)) == 3
    for points in [(0,), (1, 0)]:  # the deepest read decides where the pass stops
        whole, whole_ran = scored(llama_lm, points, reads_only=False)
        cut, cut_ran = scored(llama_lm, points, reads_only=True)
        assert (whole_ran, cut_ran) == (len(TEXTS), 0)
        assert len(whole.logits) == len(TEXTS) and cut.logits == []
        assert len(cut.reads) == len(whole.reads) == len(TEXTS) * len(points)
        for a, b in zip(cut.reads, whole.reads, strict=True):
            assert (a.row, a.positions, a.token_ids) == (b.row, b.positions, b.token_ids)
            assert torch.equal(a.residuals, b.residuals)
    # Nothing of the cut passes stays installed: the next pass runs every block.
    again, again_ran = scored(llama_lm, (), reads_only=True)
    assert again_ran == len(TEXTS) and len(again.logits) == len(TEXTS)
