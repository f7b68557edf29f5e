"""The unsteered model's log-likelihood of given continuations, token by token.

A steered text's fluency is how probable the unsteered model finds it after the same prompt:
one forward pass over prompt + continuation, the output head applied to the positions that
predict the continuation only (the others' logits are never computed), and each actual token's
log-probability picked out. Runs on the scheduler thread like every forward pass.
"""

from __future__ import annotations

import torch

from millm.engine.jobs import LikelihoodJob, LikelihoodsReady
from millm.engine.loader import LoadedModel


def continuation_logprobs(lm: LoadedModel, sequence: list[int], start: int) -> list[float]:
    """log p(sequence[t] | sequence[:t]) for t = start .. len-1 (start >= 1), unsteered."""
    if not 1 <= start <= len(sequence):
        raise ValueError(f"start {start} must be within 1..{len(sequence)}")
    if start == len(sequence):
        return []
    logits = lm.runner.prompt_logits(sequence, start)
    targets = torch.tensor(sequence[start:], dtype=torch.long, device=logits.device)
    picked = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
    return picked.cpu().tolist()


@torch.inference_mode()
def run_likelihood(lm: LoadedModel, job: LikelihoodJob) -> None:
    """Score each sequence's continuation; emits one LikelihoodsReady."""
    lm.residual.clear()  # never steered, never read
    results = []
    for sequence, start in zip(job.sequences, job.starts, strict=True):
        if job.cancelled.is_set():
            return
        results.append(continuation_logprobs(lm, sequence, start))
    job.emit(LikelihoodsReady(results))
