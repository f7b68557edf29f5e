"""Serving /v1/embeddings: mean-pooled final hidden states of each input, never steered."""

from __future__ import annotations

import base64

import numpy as np
from anyio import to_thread

from millm.engine.jobs import EmbeddingJob, EmbeddingsReady
from millm.v1.objects import Embedding, EmbeddingList, EmbeddingUsage
from millm.v1.policy.field_policy import handle_unused, unused_locations
from millm.v1.serving.generation import answered
from millm.v1.serving.parts import ServingParts
from millm.v1.serving.prechecks import precheck
from millm.v1.serving.prompts import embedding_inputs
from millm.v1.serving.protocol import EmbeddingRequest
from millm.v1.serving.replies import Reply, Report


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


async def embed(state: ServingParts, body: EmbeddingRequest, strict: bool) -> Reply:
    """Mean-pooled last hidden layer over each input's real tokens."""
    # Embeddings are never steered: a variant's are its base's, answered under the variant's name.
    named = state.variants.named(body.model)
    body = state.variants.on_base(named, body)
    await precheck(state, body, strict)
    # What embeddings ignore does not depend on the model: reported (or refused) before it is held.
    ignored = handle_unused(unused_locations(body), strict)
    lm = await state.switch.acquire(body.model)
    prompts = await to_thread.run_sync(embedding_inputs, lm, body.input)
    ready = await answered(
        state.switch.submit, EmbeddingsReady, lambda emit: EmbeddingJob(prompts=prompts, emit=emit)
    )
    vectors = ready.vectors
    tokens = sum(len(p) for p in prompts)
    answer = await to_thread.run_sync(
        embedding_list, vectors.numpy(), body.encoding_format, named.served, tokens
    )
    return Reply(Report(ignored), body=answer)
