"""Scoring mode on /v1/completions and /v1/chat/completions: next-token log-probabilities, unsteered.

The rules of the API page's "Scoring mode" and "Chat scoring" sections: one forward pass per
prompt and nothing generated; max_tokens 1 and n 1; normalisation over allowed_token_ids;
OpenAI's legacy shape for completions and its chat shape (with bytes) for chat.
"""

from __future__ import annotations

import math
from itertools import accumulate

from millm.engine.jobs import Ranking, ScoresReady, ScoringJob
from millm.engine.loader import LoadedModel
from millm.engine.scoring import Echoed, Scored, check_reported
from millm.errors import ContextLengthExceeded, InvalidScoringRequest, NonFiniteLogits
from millm.protocol.completion_objects import (
    AssistantMessage,
    ChatChoice,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    TokenLogprob,
    TopLogprob,
)
from millm.service.composition import ServerState
from millm.service.serving.generation import OneResult


def check_allowed(lm: LoadedModel, allowed: list[int] | None) -> list[int] | None:
    """Every allowed id must be in the vocabulary; duplicates are scored once."""
    if allowed is None:
        return None
    bad = [t for t in allowed if not 0 <= t < lm.vocab_size]
    if bad:
        raise InvalidScoringRequest(
            f"allowed_token_ids holds ids outside the vocabulary (0..{lm.vocab_size - 1}): {bad[:10]}",
            param="allowed_token_ids",
        )
    return list(dict.fromkeys(allowed))


def check_scored_lengths(lm: LoadedModel, prompts: list[list[int]], param: str) -> None:
    """A scored prompt must fit the context window (the next token needs no position of its own)."""
    for index, prompt in enumerate(prompts):
        if len(prompt) > lm.context_length:
            where = param if len(prompts) == 1 else f"{param}[{index}]"
            raise ContextLengthExceeded(
                limit=lm.context_length, prompt_tokens=len(prompt), max_tokens=0, param=where
            )


async def score_and_read(
    state: ServerState,
    prompts: list[list[int]],
    ranking: Ranking,
    reads: tuple = (),
    echo: bool = False,
) -> ScoresReady:
    """Each prompt's ranked next token (ranked on the scheduler thread), with `echo` its own
    tokens scored too, and what `reads` captured of its pass."""
    result = OneResult(ScoresReady)
    job = ScoringJob(prompts=prompts, emit=result.emit, reads=reads, ranking=ranking, echo=echo)
    state.switch.submit(job)
    try:
        return await result.wait()
    finally:
        job.cancel()


def token_text(lm: LoadedModel, token_id: int) -> str:
    """A single token decoded on its own (special tokens by name)."""
    return lm.tokenizer.decode(
        [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )  # type: ignore[return-value]  # transformers types decode() as str | list[str]; one id list decodes to a str


def token_key(lm: LoadedModel, token_id: int, by_id: bool) -> str:
    """How a token is named in the response: its text, or token_id:<id>."""
    return f"token_id:{token_id}" if by_id else token_text(lm, token_id)


def merged(entries: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Entries keyed by the same text share one: its log-probability is the total (logsumexp)."""
    totals: dict[str, float] = {}
    for key, logprob in entries:
        if key in totals:
            high, low = max(totals[key], logprob), min(totals[key], logprob)
            totals[key] = high + math.log1p(math.exp(low - high)) if low != float("-inf") else high
        else:
            totals[key] = logprob
    return sorted(totals.items(), key=lambda kv: -kv[1])


def completion_choice(
    lm: LoadedModel,
    scored: Scored,
    index: int,
    prompt_text: str,
    logprobs: int | None,
    allowed,
    by_id: bool,
) -> CompletionChoice:
    """A legacy completions choice: the chosen token's text and, when asked, OpenAI's logprobs object."""
    text = token_text(lm, scored.chosen)
    if logprobs is None:
        return CompletionChoice(index=index, text=text, finish_reason="length")
    # With allowed_token_ids every listed token is returned; otherwise the `logprobs` most probable.
    shown = len(scored.ranked) if allowed else logprobs
    check_reported(scored, shown)
    top = merged([(token_key(lm, t, by_id), lp) for t, lp in scored.ranked[:shown]])
    detail = CompletionLogprobs(
        tokens=[token_key(lm, scored.chosen, by_id)],
        token_logprobs=[scored.chosen_logprob],
        top_logprobs=[dict(top)],
        text_offset=[len(prompt_text)],
    )
    return CompletionChoice(index=index, text=text, logprobs=detail, finish_reason="length")


def echoed_choice(
    lm: LoadedModel,
    scored: Scored,
    index: int,
    prompt: tuple[list[int], str, Echoed],
    logprobs: int,
    by_id: bool,
    generated: bool,
) -> CompletionChoice:
    """A legacy completions choice with echo: the prompt's tokens with their log-probabilities
    (null for the first, which nothing predicts) and `logprobs` alternatives each, then the next
    token when one was asked for (max_tokens 1); offsets count characters of the echoed text."""
    ids, prompt_text, echoed = prompt
    pieces = [token_text(lm, t) for t in ids]
    keys = [f"token_id:{t}" for t in ids] if by_id else pieces
    offsets = [0, *accumulate(map(len, pieces[:-1]))]
    token_logprobs: list[float | None] = [None, *echoed.token_logprobs]
    tops: list[dict[str, float] | None] = [None]
    for position, alternatives in enumerate(echoed.top, start=1):
        if echoed.token_logprobs[position - 1] == float("-inf"):
            raise NonFiniteLogits(f"prompt token {position} ({ids[position]}) has a -inf logit")
        tops.append(dict(merged([(token_key(lm, t, by_id), lp) for t, lp in alternatives])))
    text = prompt_text
    if generated:
        check_reported(scored, logprobs)
        keys.append(token_key(lm, scored.chosen, by_id))
        token_logprobs.append(scored.chosen_logprob)
        top = scored.ranked[:logprobs]
        tops.append(dict(merged([(token_key(lm, t, by_id), lp) for t, lp in top])))
        offsets.append(len(prompt_text))
        text += token_text(lm, scored.chosen)
    detail = CompletionLogprobs(
        tokens=keys, token_logprobs=token_logprobs, top_logprobs=tops, text_offset=offsets
    )
    return CompletionChoice(index=index, text=text, logprobs=detail, finish_reason="length")


def chat_choice(
    lm: LoadedModel,
    scored: Scored,
    index: int,
    logprobs: bool,
    top_logprobs: int | None,
    by_id: bool,
) -> ChatChoice:
    """A chat choice: the chosen token as the message and, with logprobs: true, OpenAI's chat logprobs."""
    text = token_text(lm, scored.chosen)
    message = AssistantMessage(content=text)
    if not logprobs:
        return ChatChoice(index=index, message=message, finish_reason="length")
    shown = min(top_logprobs or 0, len(scored.ranked))
    check_reported(scored, shown)
    top = merged([(token_key(lm, t, by_id), lp) for t, lp in scored.ranked[:shown]])
    texts = {token_key(lm, t, by_id): token_text(lm, t) for t, _ in scored.ranked[:shown]}
    alternatives = [
        TopLogprob(token=key, logprob=lp, bytes=list(texts[key].encode("utf-8"))) for key, lp in top
    ]
    chosen = TokenLogprob(
        token=token_key(lm, scored.chosen, by_id),
        logprob=scored.chosen_logprob,
        bytes=list(text.encode("utf-8")),
        top_logprobs=alternatives,
    )
    return ChatChoice(
        index=index,
        message=message,
        logprobs=ChatLogprobs(content=[chosen]),
        finish_reason="length",
    )
