"""How tokens and their log-probabilities are said in OpenAI's shapes: a token by its text (or
`token_id:<id>`), alternatives that decode to the same text merged into one entry, chat's
`logprobs.content` entries and the legacy completions object. Scoring mode says one token this
way; a generation with logprobs (beyond the spec, issue 34) says every drawn token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate

from millm.engine.jobs import TokenDrawn
from millm.engine.loader import LoadedModel
from millm.engine.scoring import Echoed
from millm.errors import NonFiniteLogits
from millm.v1.objects import (
    ChatLogprobs,
    CompletionLogprobs,
    TokenLogprob,
    TopLogprob,
)


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


@dataclass(frozen=True)
class TokenWords:
    """A model's tokens said by text, or by id (return_tokens_as_token_ids)."""

    lm: LoadedModel
    by_id: bool

    def key(self, token: int) -> str:
        """How `token` is named."""
        return token_key(self.lm, token, self.by_id)

    def chat_entry(
        self, token: int, logprob: float, ranked: list[tuple[int, float]] | tuple
    ) -> TokenLogprob:
        """One chat logprobs entry: the token, its log-probability and bytes, its alternatives."""
        top = merged([(self.key(t), lp) for t, lp in ranked])
        texts = {self.key(t): token_text(self.lm, t) for t, _ in ranked}
        alternatives = [
            TopLogprob(token=key, logprob=lp, bytes=list(texts[key].encode("utf-8")))
            for key, lp in top
        ]
        text = token_text(self.lm, token)
        return TokenLogprob(
            token=self.key(token),
            logprob=logprob,
            bytes=list(text.encode("utf-8")),
            top_logprobs=alternatives,
        )

    def chat(self, drawn: list[TokenDrawn]) -> ChatLogprobs:
        """Chat's logprobs of generated tokens."""
        return ChatLogprobs(content=[self.chat_entry(d.token, d.logprob, d.top) for d in drawn])

    def text_length(self, drawn: list[TokenDrawn]) -> int:
        """Characters the tokens' own texts take, one after another."""
        return sum(len(token_text(self.lm, d.token)) for d in drawn)

    def prompt(self, ids: list[int], echoed: Echoed) -> CompletionLogprobs:
        """The legacy object of an echoed prompt: its first token has no log-probability."""
        pieces = [token_text(self.lm, t) for t in ids]
        tops: list[dict[str, float] | None] = [None]
        for position, alternatives in enumerate(echoed.top, start=1):
            if echoed.token_logprobs[position - 1] == -math.inf:
                raise NonFiniteLogits(f"prompt token {position} ({ids[position]}) has a -inf logit")
            tops.append(dict(merged([(self.key(t), lp) for t, lp in alternatives])))
        return CompletionLogprobs(
            tokens=[f"token_id:{t}" for t in ids] if self.by_id else pieces,
            token_logprobs=[None, *echoed.token_logprobs],
            top_logprobs=tops,
            text_offset=list(accumulate(map(len, pieces[:-1]), initial=0)),
        )

    def legacy(self, drawn: list[TokenDrawn], offset: int) -> CompletionLogprobs:
        """The legacy object of generated tokens whose text begins at character `offset`."""
        pieces = [token_text(self.lm, d.token) for d in drawn]
        return CompletionLogprobs(
            tokens=[self.key(d.token) for d in drawn],
            token_logprobs=[d.logprob for d in drawn],
            top_logprobs=[dict(merged([(self.key(t), lp) for t, lp in d.top])) for d in drawn],
            text_offset=list(accumulate(map(len, pieces[:-1]), initial=offset)) if pieces else [],
        )


def joined(first: CompletionLogprobs, then: CompletionLogprobs) -> CompletionLogprobs:
    """Two legacy objects as one: the echoed prompt's, then the completion's."""
    return CompletionLogprobs(
        tokens=first.tokens + then.tokens,
        token_logprobs=first.token_logprobs + then.token_logprobs,
        top_logprobs=first.top_logprobs + then.top_logprobs,
        text_offset=first.text_offset + then.text_offset,
    )
