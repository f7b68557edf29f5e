"""Constrained decoding: a JSON grammar per row, through llguidance.

llguidance was chosen by measurement (docs/structured-output.md): it enforced every keyword of
millm's subset with no invalid document in our random-walk tests, refuses the keywords it
cannot enforce instead of ignoring them, and compiles and masks fastest of those measured
there. Whitespace between tokens is bounded (at most 16
characters) so an output cannot run away to max_tokens in blank space.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import numpy as np
import torch

from millm.errors import InvalidRequest

WHITESPACE = r"[\x20\x0A\x0D\x09]{0,16}"
COMPACT = r"[\x20]?"  # tool calls: the server re-serialises the arguments, so layout is only cost


@dataclass(frozen=True)
class GrammarSpec:
    """A row's constraint: the JSON Schema it must follow ({"type": "object"} for json_object)."""

    schema_json: str
    whitespace: str = WHITESPACE  # what may stand between JSON tokens
    param: str = "response_format"  # the request field a refusal names


class GrammarSupport:
    """The model's tokenizer as llguidance needs it: built once (about 2 s), on first use."""

    def __init__(self, tokenizer, vocab_size: int):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._built = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        """llguidance's view of the tokenizer."""
        with self._lock:
            if self._built is None:
                import llguidance.hf

                self._built = llguidance.hf.from_tokenizer(
                    self._tokenizer, n_vocab=self._vocab_size
                )
            return self._built

    def grammar(self, spec: GrammarSpec):
        """The grammar text of a JSON Schema, whitespace bounded."""
        import llguidance

        return llguidance.LLMatcher.grammar_from_json_schema(
            json.loads(spec.schema_json), overrides={"whitespace_pattern": spec.whitespace}
        )

    def matcher(self, spec: GrammarSpec) -> RowConstraint:
        """A fresh matcher for one row (400 if the library cannot build the grammar)."""
        import llguidance

        try:
            grammar = self.grammar(spec)
        except Exception as exc:  # the library's own refusal of a schema
            raise InvalidRequest(
                f"{spec.param}: the schema cannot be compiled: {exc}",
                param=spec.param,
                code="response_format_unsupported",
            ) from None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(
                f"{spec.param}: the schema cannot be compiled: {matcher.get_error()}",
                param=spec.param,
                code="response_format_unsupported",
            )
        return RowConstraint(matcher, self._vocab_size)


class RowConstraint:
    """One row's matcher: masks the logits before sampling, advances with the sampled token."""

    def __init__(self, matcher, vocab_size: int):
        import llguidance.torch

        self._matcher = matcher
        self._vocab_size = vocab_size
        self._bits = llguidance.torch.allocate_token_bitmask(1, vocab_size)
        self._fill = llguidance.torch.fill_next_token_bitmask

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with every token the grammar forbids set to -inf."""
        self._fill(self._matcher, self._bits, 0)
        allowed = np.unpackbits(self._bits[0].numpy().view(np.uint8), bitorder="little")[
            : self._vocab_size
        ]
        mask = torch.from_numpy(allowed.astype(bool)).to(logits.device)
        return logits.masked_fill(~mask[: logits.shape[-1]], float("-inf"))

    def advance(self, token: int) -> None:
        """Feed the sampled token to the matcher."""
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: {self._matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The document is complete and nothing but end-of-sequence may follow."""
        return self._matcher.is_stopped()
