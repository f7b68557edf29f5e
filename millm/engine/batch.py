"""The rows that decode together: their KV cache, 2-D attention mask and positions.

Rows are left-padded so every row's next token sits in the last column. A row can leave
(`select_rows`) between steps; duplicating a row (n choices of one prompt) is the same call
with repeated indices. Joining a running batch (continuous batching) pads the shorter side's
cache and mask on the left; the serial policy never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class KVBatch:
    """A batch's cache and mask; row i of the mask describes row i of every cache layer."""

    cache: DynamicCache
    mask: torch.Tensor  # [B, T] int64, 0 over left padding

    @property
    def size(self) -> int:
        """Rows in the batch."""
        return int(self.mask.shape[0])


def left_pad(prompts: list[list[int]], device: torch.device, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
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


def forward_last_logits(model, input_ids, mask, cache) -> torch.Tensor:
    """One forward pass; returns the float logits of each row's last position, `[B, V]`."""
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions(mask, last=input_ids.shape[1]),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1, :].float()


def prefill(model, prompts: list[list[int]], device: torch.device) -> tuple[KVBatch, torch.Tensor]:
    """Run the prompts through the model; returns the batch and the next-token logits `[B, V]`."""
    input_ids, mask = left_pad(prompts, device)
    cache = DynamicCache(config=model.config)
    logits = forward_last_logits(model, input_ids, mask, cache)
    return KVBatch(cache, mask), logits


def decode_step(model, batch: KVBatch, next_ids: torch.Tensor) -> torch.Tensor:
    """Feed each row its newest token; returns the next-token logits `[B, V]`."""
    ones = torch.ones((batch.size, 1), dtype=batch.mask.dtype, device=batch.mask.device)
    batch.mask = torch.cat([batch.mask, ones], dim=1)
    return forward_last_logits(model, next_ids.view(-1, 1), batch.mask, batch.cache)


def select_rows(batch: KVBatch, indices: list[int]) -> None:
    """Keep (or repeat) rows by index, in the given order, in the cache and the mask alike."""
    index = torch.tensor(indices, dtype=torch.long, device=batch.mask.device)
    batch.cache.batch_select_indices(index)
    batch.mask = batch.mask[index]
