"""POST /v1/chat/completions, /v1/completions and /v1/embeddings: serve a body its model has
checked (field policy and cross-field rules: v1/serving/protocol.py), and respond."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.v1.http.deps import part, settings_of
from millm.v1.http.headers import LOAD_POLICY_HEADER, STRICT_HEADER, may_load, strict_mode
from millm.v1.http.json_body import JsonRoute
from millm.v1.serving.http_replies import respond, unless_client_leaves
from millm.v1.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from millm.v1.serving.serving import Serving

router = APIRouter(route_class=JsonRoute)


def strict(request: Request) -> bool:
    """X-miLLM-Strict (400 for a value that is not one of true, 1, false, 0)."""
    return strict_mode(request.headers.get(STRICT_HEADER))


def loads(request: Request) -> bool:
    """X-miLLM-Load-Policy: whether a model that is not loaded may be loaded for this request."""
    return may_load(request.headers.get(LOAD_POLICY_HEADER))


def ignored_cap(request: Request) -> int:
    """The byte cap of X-miLLM-Ignored-Fields."""
    return settings_of(request).ignored_fields_header_max_bytes


@router.post(
    "/v1/chat/completions", summary="Chat completion (streaming and non-streaming), or chat scoring"
)
async def chat_completions(body: ChatCompletionRequest, request: Request):
    """Answer (or continue) a conversation, and each extra_messages conversation, with the loaded
    model."""
    reply = await unless_client_leaves(
        request, part(request, Serving).chat(body, strict(request), may_load=loads(request))
    )
    return respond(reply, ignored_cap(request))


@router.post("/v1/completions", summary="Text completion (no chat template), or scoring mode")
async def completions(body: CompletionRequest, request: Request):
    """Continue each prompt verbatim (one choice per prompt), or score its next token."""
    reply = await unless_client_leaves(
        request, part(request, Serving).complete(body, strict(request), loads(request))
    )
    return respond(reply, ignored_cap(request))


@router.post("/v1/embeddings", summary="Text embeddings (always unsteered)")
async def embeddings(body: EmbeddingRequest, request: Request):
    """Each input's final hidden states pooled into one vector (mean, last or first token)."""
    reply = await unless_client_leaves(
        request, part(request, Serving).embed(body, strict(request), loads(request))
    )
    return respond(reply, ignored_cap(request))
