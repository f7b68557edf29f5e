"""Shapes shared by every runner: left-padded prompts, position ids, attention masks.

Rows are left-padded so each row's newest token sits in the last column; the 2-D mask (0 over
padding) travels with the batch, and position ids count only a row's real tokens.
"""

from __future__ import annotations

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
