"""Shapes shared by every runner: left-padded prompts, position ids, attention masks.

Rows are left-padded so each row's newest token sits in the last column; the 2-D mask (0 over
padding) travels with the batch, and position ids count only a row's real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def left_pad(
    prompts: list[list[int]], device: torch.device, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask for prompts of different lengths, padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def positions(mask: torch.Tensor, last: int | None = None) -> torch.Tensor:
    """Position ids counting only real tokens (padding gets 0); `last` keeps the final columns."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return pos if last is None else pos[:, -last:]


def extend_mask(mask: torch.Tensor) -> torch.Tensor:
    """The mask after every row receives one more real token."""
    return torch.cat(
        [mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=mask.device)], dim=1
    )


def left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    """`mask` widened to `width` columns by adding padding (zeros) on the left."""
    extra = width - mask.shape[1]
    if extra == 0:
        return mask
    return torch.cat(
        [torch.zeros((mask.shape[0], extra), dtype=mask.dtype, device=mask.device), mask], dim=1
    )


def leading_padding(mask: torch.Tensor) -> int:
    """Columns at the left that are padding in every row (they can be cut from the cache)."""
    real = mask.bool().any(0)
    return int(real.float().argmax()) if bool(real.any()) else 0


def common_skip(lengths: list[int], offered: list[int]) -> tuple[int, list[int]]:
    """Of the first positions each row brings restored (`offered`), the columns of the left-padded
    batch every row can skip together: the columns before the widest part still to compute, which
    all rows then compute as one block. Returns those columns and each row's positions in them."""
    width = max(lengths)
    done = width - max(n - r for n, r in zip(lengths, offered, strict=True))
    return done, [max(0, done - (width - n)) for n in lengths]


@dataclass
class PrefillColumns:
    """Where a chunked prefill of left-padded prompts stands: `done` columns are in the KV cache
    (restored from a prefix cache, or computed), the rest come a chunk at a time."""

    lengths: list[int]  # each row's prompt length (its real columns are the last ones)
    done: int
    reused: list[int]  # positions each row took from restored KV instead of computing

    @property
    def width(self) -> int:
        """Columns of the joining batch."""
        return max(self.lengths)

    @property
    def finished(self) -> bool:
        """Whether every column is in the cache."""
        return self.done >= self.width

    def span(self, tokens: int | None) -> int:
        """Where the next pass of `tokens` columns ends (None: the rest)."""
        return self.width if tokens is None else min(self.width, self.done + tokens)
