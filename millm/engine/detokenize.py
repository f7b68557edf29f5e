"""Incremental detokenisation: turn one token at a time into text deltas that concatenate exactly.

Decoding each token alone loses SentencePiece's leading spaces and splits multi-byte UTF-8
characters across tokens. So a short window of previous tokens is decoded with the new one and
only the text past the window is emitted; a delta ending in U+FFFD (an incomplete character)
waits for the next token.
"""

from __future__ import annotations

CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Streams a row's generated text; the prompt's last tokens give the first token its context."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self._tokenizer = tokenizer
        context = list(prompt_ids[-CONTEXT_TOKENS:])
        self._ids = context
        self._prefix = 0
        self._read = len(context)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def push(self, token_id: int) -> str:
        """Add one generated token; return the new text it completes (maybe empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return any text still waiting for a character to complete (at the end of generation)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        return delta
