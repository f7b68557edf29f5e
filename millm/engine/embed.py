"""Embeddings: the mean of the final (normalised) hidden states over each input's real tokens.

Always unsteered: the residual editor is cleared first, so every hook is a no-op and the
vectors are bit-identical to a model with no SAE attached.
"""

from __future__ import annotations

import torch

from millm.engine.jobs import EmbeddingJob, EmbeddingsReady
from millm.engine.loader import LoadedModel

CHUNK = 16  # inputs per forward pass: bounds activation memory for long lists


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average `[B, T, d]` over the positions where `mask` is 1, in float32."""
    weights = mask.to(torch.float32).unsqueeze(-1)
    return (hidden.float() * weights).sum(1) / weights.sum(1)


@torch.inference_mode()
def run_embedding(lm: LoadedModel, job: EmbeddingJob) -> None:
    """Embed every input of the job in chunks and emit one event with all vectors."""
    lm.residual.clear()
    vectors = []
    for start in range(0, len(job.prompts), CHUNK):
        if job.cancelled.is_set():
            return
        hidden, mask = lm.runner.hidden_states(job.prompts[start : start + CHUNK])
        vectors.append(mean_pool(hidden, mask).cpu())
    job.emit(EmbeddingsReady(torch.cat(vectors)))
