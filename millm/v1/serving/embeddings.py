"""Serving /v1/embeddings: mean-pooled final hidden states of each input, never steered."""

from __future__ import annotations

import base64

import numpy as np

from millm.v1.objects import Embedding, EmbeddingList, EmbeddingUsage


def encode(vector: np.ndarray, encoding_format: str | None) -> list[float] | str:
    """A float list, or OpenAI's base64 of little-endian float32."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def embedding_list(
    vectors: np.ndarray, encoding_format: str | None, model: str, tokens: int
) -> EmbeddingList:
    """The body: one entry per input, in order."""
    data = [Embedding(index=i, embedding=encode(v, encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingList(
        data=data, model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    )
