"""Choosing the next token from a row's logits: penalties, temperature, nucleus, seeded draws.

Pure functions over one row's logits vector, so every rule has a table-driven test and rows
with different parameters can share a batch.

Penalty mapping (OpenAI's frequency/presence penalties onto a repetition penalty):
for every token t already in this row's completion, with count c_t,

    e_t = presence_penalty * [c_t > 0] + frequency_penalty * c_t
    r_t = 1.1 ** e_t

and the token's logit is divided by r_t when positive and multiplied by r_t when negative
(the CTRL / Hugging Face repetition penalty, with a per-token factor). So a presence penalty
of 1 is the familiar repetition_penalty=1.1, a frequency penalty compounds with each repeat,
and negative values (down to -2) make repetition more likely. Prompt tokens are not counted,
as in OpenAI's definition ("the text so far" of the completion).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PENALTY_BASE = 1.1


@dataclass(frozen=True)
class SamplingParams:
    """Per-row decoding parameters, already validated by the caller."""

    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        """Temperature 0 means argmax, as OpenAI documents."""
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """Whether the repetition penalty has anything to do."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def penalty_factors(counts: torch.Tensor, presence: float, frequency: float) -> torch.Tensor:
    """r_t = 1.1 ** (presence * [c_t > 0] + frequency * c_t) for the counts of seen tokens."""
    exponent = presence * (counts > 0).to(torch.float32) + frequency * counts.to(torch.float32)
    return torch.pow(torch.tensor(PENALTY_BASE), exponent)


def apply_repetition_penalty(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    counts: torch.Tensor,
    presence: float,
    frequency: float,
) -> torch.Tensor:
    """Return logits with the penalty applied to `token_ids` (unique ids seen, with their
    counts)."""
    if token_ids.numel() == 0:
        return logits
    factors = penalty_factors(counts, presence, frequency).to(logits.dtype).to(logits.device)
    seen = logits[token_ids]
    penalised = torch.where(seen > 0, seen / factors, seen * factors)
    out = logits.clone()
    out[token_ids] = penalised
    return out


def top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask of the smallest set of most-probable tokens whose mass reaches top_p (never
    empty)."""
    sorted_probs, order = torch.sort(probs, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    # Keep a token if the mass strictly before it is still short of top_p; the top token always
    # stays.
    keep_sorted = (cumulative - sorted_probs) < top_p
    keep_sorted[0] = True
    keep = torch.zeros_like(keep_sorted)
    keep[order] = keep_sorted
    return keep


def penalised(
    logits: torch.Tensor,
    params: SamplingParams,
    seen_ids: torch.Tensor | None = None,
    seen_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """A row's float logits `[V]` with its repetition penalty applied (what the draw sees)."""
    logits = logits.float()
    if params.penalised and seen_ids is not None and seen_counts is not None:  # given together
        logits = apply_repetition_penalty(
            logits, seen_ids, seen_counts, params.presence_penalty, params.frequency_penalty
        )
    return logits


def drawn_logprobs(
    logits: torch.Tensor, params: SamplingParams, token: int, top: int
) -> tuple[float, list[tuple[int, float]]]:
    """The drawn token's log-probability and the `top` most probable, from the distribution it
    was drawn from: the penalised logits `[V]` over the temperature (greedy and nucleus draws
    read it unscaled and untruncated, as scoring mode does)."""
    scaled = logits if params.greedy else logits / params.temperature
    if not bool(torch.isfinite(scaled.max())):
        scaled = (logits.double() - logits.max()) / (params.temperature or 1.0)
    logprobs = torch.log_softmax(scaled, dim=-1)
    if not top:
        return float(logprobs[token]), []
    values, ids = torch.topk(logprobs, min(top, logprobs.shape[0]))
    # A grammar's mask leaves some ids impossible (-inf): they are no alternatives.
    pairs = [(t, v) for t, v in zip(ids.tolist(), values.tolist(), strict=True) if v > -math.inf]
    return float(logprobs[token]), pairs


def next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    seen_ids: torch.Tensor | None = None,
    seen_counts: torch.Tensor | None = None,
) -> int:
    """Pick the next token id for one row from its float logits `[V]`."""
    logits = penalised(logits, params, seen_ids, seen_counts)
    if params.greedy:
        return int(torch.argmax(logits))
    scaled = logits / params.temperature
    if not bool(torch.isfinite(scaled.max())):
        # A tiny temperature overflows float32 (or is 0 there): the same distribution, shifted to a
        # top of 0 and scaled in float64, where every positive temperature is a number.
        scaled = (logits.double() - logits.max()) / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        probs = probs * top_p_mask(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))
