"""POST /v1/embeddings: mean-pooled final hidden states, never steered."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from millm.api.field_policy import EMBEDDINGS, check_fields
from millm.api.prechecks import precheck
from millm.api.protocol import OpenBody
from millm.api.unused_fields import handle_unused, unused_locations
from millm.engine.jobs import EmbeddingJob
from millm.engine.loader import LoadedModel
from millm.engine.prompts import completion_prompt_ids
from millm.errors import ContextLengthExceeded, InvalidRequest
from millm.service.generation import OneResult
from millm.service.state import ServerState

router = APIRouter()


class EmbeddingRequest(OpenBody):
    """OpenAI's embeddings body."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None


def embedding_inputs(lm: LoadedModel, value) -> list[list[int]]:
    """Every input as token ids, each checked against the vocabulary and the context window."""
    if isinstance(value, str):
        items: list = [value]
    elif value and all(isinstance(v, int) for v in value):
        items = [value]
    else:
        items = list(value)
    if not items:
        raise InvalidRequest("input must not be empty", param="input")
    prompts = []
    for i, item in enumerate(items):
        param = "input" if len(items) == 1 else f"input[{i}]"
        ids = completion_prompt_ids(lm.tokenizer, item) if isinstance(item, str) else list(item)
        if not ids:
            raise InvalidRequest(f"{param} tokenises to nothing", param=param)
        if any(not 0 <= t < lm.vocab_size for t in ids):
            raise InvalidRequest(f"{param} holds token ids outside the vocabulary (0..{lm.vocab_size - 1})", param=param)
        if len(ids) > lm.context_length:
            raise ContextLengthExceeded(limit=lm.context_length, prompt_tokens=len(ids), max_tokens=0, param=param)
        prompts.append(ids)
    return prompts


def encode(vector: np.ndarray, encoding_format: str | None):
    """A float list, or OpenAI's base64 of little-endian float32."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


@router.post("/v1/embeddings", summary="Text embeddings (always unsteered)")
async def embeddings(body: EmbeddingRequest, request: Request):
    """Mean-pooled last hidden layer over each input's real tokens."""
    state: ServerState = request.app.state.millm
    check_fields(body.model_dump(exclude_unset=True), EMBEDDINGS, scoring=False, streaming=False)
    checked = await precheck(request, state, body)
    # What embeddings ignore does not depend on the model: reported (or refused) before it is held.
    headers = handle_unused(unused_locations(body), checked.strict, state.settings.ignored_fields_header_max_bytes)
    lm = await state.acquire(body.model)
    prompts = await run_in_threadpool(embedding_inputs, lm, body.input)
    result = OneResult()
    job = EmbeddingJob(prompts=prompts, emit=result.emit)
    state.submit(job)
    try:
        vectors = (await result.wait()).vectors.numpy()
    finally:
        job.cancel()
    data = [{"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)} for i, v in enumerate(vectors)]
    tokens = sum(len(p) for p in prompts)
    payload = {"object": "list", "data": data, "model": lm.name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return JSONResponse(payload, headers={**headers, "X-miLLM-Steering": "none"})
