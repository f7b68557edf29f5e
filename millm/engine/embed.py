"""Embeddings: each input's final (normalised) hidden states pooled into one vector: their mean
over its real tokens (the default), its last token's, or its first token's (`cls`).

Always unsteered: the residual editor is cleared first, so every hook is a no-op and the
vectors are bit-identical to a model with no SAE attached. Pooling reads the mask, so left
padding (the transformers runners) and right padding (llama.cpp) pool alike.
"""

from __future__ import annotations

import torch

from millm.engine.jobs import EmbeddingJob, EmbeddingsReady, Pooling
from millm.engine.loader import LoadedModel

CHUNK = 16  # inputs per forward pass: bounds activation memory for long lists


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average `[B, T, d]` over the positions where `mask` is 1, in float32."""
    weights = mask.to(torch.float32).unsqueeze(-1)
    return (hidden.float() * weights).sum(1) / weights.sum(1)


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """Each row of `[B, T, d]` as one float32 vector: `mean` over the real positions, or the state
    at the last (`last`) or first (`cls`) real position."""
    if pooling == "mean":
        return mean_pool(hidden, mask)
    real = mask.bool()
    index = torch.arange(mask.shape[1], device=mask.device)
    if pooling == "last":
        at = torch.where(real, index, -1).amax(1)
    else:
        at = torch.where(real, index, mask.shape[1]).amin(1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), at].float()


@torch.inference_mode()
def run_embedding(lm: LoadedModel, job: EmbeddingJob) -> None:
    """Embed every input of the job in chunks and emit one event with all vectors."""
    lm.residual.clear()
    vectors = []
    for start in range(0, len(job.prompts), CHUNK):
        if job.cancelled.is_set():
            return
        hidden, mask = lm.runner.hidden_states(job.prompts[start : start + CHUNK])
        vectors.append(pool(hidden, mask, job.pooling).cpu())
    job.emit(EmbeddingsReady(torch.cat(vectors)))
