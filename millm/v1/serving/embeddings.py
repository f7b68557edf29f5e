"""Serving /v1/embeddings: each input's pooled final hidden states, never steered; scaled to
length 1 when asked, and never answered with a NaN or an infinity."""

from __future__ import annotations

import base64

import numpy as np

from millm.errors import EmbeddingInvalid
from millm.v1.objects import Embedding, EmbeddingList, EmbeddingUsage


def checked(vectors: np.ndarray, normalize: bool) -> np.ndarray:
    """The vectors (float32), each divided by its L2 norm when `normalize`; a non-finite vector,
    or one of length 0 to normalise, is refused naming its input."""
    vectors = vectors.astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1)
    for i, (vector, norm) in enumerate(zip(vectors, norms, strict=True)):
        if not np.isfinite(vector).all() or not np.isfinite(norm):
            raise EmbeddingInvalid(f"input[{i}]'s embedding is not finite", param=f"input[{i}]")
        if normalize and norm == 0:
            raise EmbeddingInvalid(
                f"input[{i}]'s embedding has length 0, so it cannot be normalised",
                param=f"input[{i}]",
            )
    return vectors / norms[:, None] if normalize else vectors


def encode(vector: np.ndarray, encoding_format: str | None) -> list[float] | str:
    """A float list, or OpenAI's base64 of little-endian float32."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def embedding_list(
    vectors: np.ndarray, encoding_format: str | None, model: str, tokens: int, normalize: bool
) -> EmbeddingList:
    """The body: one entry per input, in order (normalised when asked)."""
    vectors = checked(vectors, normalize)
    data = [Embedding(index=i, embedding=encode(v, encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingList(
        data=data, model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    )
