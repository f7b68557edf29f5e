"""vLLM's tokenizer routes (beyond the spec, issue 34): POST /tokenize, POST /detokenize and
GET /tokenizer_info, for the named model or the loaded one; lm-evaluation-harness's remote
tokenizer reads them. The API key opens them as it opens /v1."""

from __future__ import annotations

from fastapi import APIRouter, Request

from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute
from millm.v1.tokenizer.protocol import DetokenizeRequest, TokenizeRequest
from millm.v1.tokenizer.serving import Tokenizers

router = APIRouter(route_class=JsonRoute)


@router.post("/tokenize", summary="A text's token ids, as /v1/completions tokenises a prompt")
async def tokenize(body: TokenizeRequest, request: Request) -> dict:
    """The ids, their count and the model's context window (`token_strs` when asked)."""
    return (await part(request, Tokenizers).tokenize(body)).model_dump()


@router.post("/detokenize", summary="Token ids back to text")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    """The text the ids decode to, special tokens included."""
    return (await part(request, Tokenizers).detokenize(body)).model_dump()


@router.get("/tokenizer_info", summary="The tokenizer's class, special tokens and chat template")
async def tokenizer_info(request: Request, model: str | None = None) -> dict:
    """What a client needs to tokenise and template as the server does."""
    return (await part(request, Tokenizers).info(model)).model_dump()
