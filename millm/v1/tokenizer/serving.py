"""The tokenizer routes (beyond the spec, issue 34): a text to ids, ids to text, and the
tokenizer's facts, for the model a request names (the loaded one when it names none), held by
the request like any /v1 request's model. A variant's tokenizer is its base's."""

from __future__ import annotations

from anyio import to_thread

from millm.engine.loader import LoadedModel
from millm.engine.prompts import completion_prompt_ids
from millm.errors import InvalidRequest
from millm.v1.tokenizer.parts import TokenizerParts
from millm.v1.tokenizer.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)


def tokenized(lm: LoadedModel, body: TokenizeRequest) -> TokenizeResponse:
    """The prompt's ids as /v1/completions would make them."""
    add_special = True if body.add_special_tokens is None else body.add_special_tokens
    ids = completion_prompt_ids(lm.tokenizer, body.prompt, add_special)
    strs = lm.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return TokenizeResponse(
        count=len(ids), max_model_len=lm.context_length, tokens=ids, token_strs=strs
    )


def detokenized(lm: LoadedModel, body: DetokenizeRequest) -> DetokenizeResponse:
    """The ids' text, refusing ids outside the vocabulary (400 naming `tokens`)."""
    bad = [t for t in body.tokens if not 0 <= t < lm.vocab_size]
    if bad:
        raise InvalidRequest(
            f"tokens holds ids outside the vocabulary (0..{lm.vocab_size - 1}): {bad[:5]}",
            param="tokens",
        )
    text = lm.tokenizer.decode(body.tokens, skip_special_tokens=False)
    return DetokenizeResponse(prompt=text)


def info(lm: LoadedModel) -> TokenizerInfo:
    """The tokenizer's class, special tokens, template and window."""
    tokenizer = lm.tokenizer
    return TokenizerInfo(
        model=lm.name,
        tokenizer_class=type(tokenizer).__name__,
        vocab_size=lm.vocab_size,
        model_max_length=lm.context_length,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        unk_token=tokenizer.unk_token,
        chat_template=getattr(tokenizer, "chat_template", None),
    )


class Tokenizers:
    """The tokenizer routes' facade."""

    def __init__(self, state: TokenizerParts):
        self.state = state

    async def _held(self, model: str | None) -> LoadedModel:
        """The named model (a variant's base; loaded first if registered and not loaded), or the
        loaded one."""
        named = self.state.variants.named(model or self.state.switch.expected_name)
        return await self.state.switch.acquire(named.base)

    async def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        """POST /tokenize."""
        return await to_thread.run_sync(tokenized, await self._held(body.model), body)

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        """POST /detokenize."""
        return await to_thread.run_sync(detokenized, await self._held(body.model), body)

    async def info(self, model: str | None) -> TokenizerInfo:
        """GET /tokenizer_info."""
        answer = info(await self._held(model))
        return answer.model_copy(update={"model": model}) if model else answer
