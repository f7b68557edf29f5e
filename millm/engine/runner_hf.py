"""The generic runner: any transformers causal LM through its own forward and a DynamicCache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from millm.engine.batch import extend_mask, leading_padding, left_pad, left_pad_mask, positions
from millm.engine.families import final_softcap, soft_capped
from millm.engine.kernels import KernelPlan, install_linear


def pad_left(states: torch.Tensor, width: int) -> torch.Tensor:
    """Cached keys or values `[B, H, T, D]` widened to `width` positions with zeros on the left."""
    extra = width - states.shape[2]
    if extra == 0:
        return states
    return torch.cat(
        [states.new_zeros(states.shape[0], states.shape[1], extra, states.shape[3]), states], dim=2
    )


@dataclass
class HFBatch:
    """A batch's cache and mask; row i of the mask describes row i of every cache layer."""

    cache: DynamicCache
    mask: torch.Tensor  # [B, T] int64, 0 over left padding


class HeadOverHidden:
    """prompt_logits for runners over a transformers model: the output layer over hidden_states."""

    model: Any
    hidden_states: Callable[[list[list[int]]], tuple[torch.Tensor, torch.Tensor]]

    def prompt_logits(self, sequence: list[int], start: int) -> torch.Tensor:
        """Logits `[len - start, V]` at the positions predicting sequence[start:] (start >= 1);
        only those go through the head."""
        hidden, _ = self.hidden_states([sequence])
        head = self.model.get_output_embeddings()
        logits = head(hidden[0, start - 1 : len(sequence) - 1]).float()
        return soft_capped(logits, final_softcap(self.model.config))


class HFRunner(HeadOverHidden):
    """Prefill / step / select over the model's own forward (Gemma2, and every other family)."""

    name = "transformers"

    def __init__(
        self,
        model,
        device: torch.device,
        dtype: torch.dtype,
        body: KernelPlan | None,
        head: KernelPlan | None,
    ):
        self.model, self.device, self.dtype = model, device, dtype
        lm_head = model.get_output_embeddings()
        if body is not None:
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and module is not lm_head:
                    install_linear(module, body.linear(module.weight, module.bias))
        if head is not None:
            head_fn = head.linear(lm_head.weight, lm_head.bias)
            install_linear(lm_head, lambda x: head_fn(x.to(head.dtype)))
        model.to(dtype)
        self.kernels = body.description if body is not None else "dense"
        # Caches that grow by plain concatenation can be merged and cut; sliding-window or
        # static layers keep positions their own way, so such models batch only per request.
        layers = DynamicCache(config=model.config).layers
        self.mergeable = all(type(layer) is DynamicLayer for layer in layers)

    def _logits(
        self, input_ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions(mask, last=input_ids.shape[1]),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def prefill(self, prompts: list[list[int]], capacity: int) -> tuple[HFBatch, torch.Tensor]:
        """Run the prompts; returns the batch and next-token logits `[B, V]` (capacity is unused:
        the cache grows)."""
        input_ids, mask = left_pad(prompts, self.device)
        cache = DynamicCache(config=self.model.config)
        return HFBatch(cache, mask), self._logits(input_ids, mask, cache)

    def step(self, batch: HFBatch, next_ids: torch.Tensor) -> torch.Tensor:
        """Feed each row its newest token; returns the next-token logits `[B, V]`."""
        batch.mask = extend_mask(batch.mask)
        return self._logits(next_ids.view(-1, 1), batch.mask, batch.cache)

    def select_rows(self, batch: HFBatch, indices: list[int]) -> None:
        """Keep (or repeat) rows by index, in the given order, in the cache and the mask alike."""
        index = torch.tensor(indices, dtype=torch.long, device=batch.mask.device)
        batch.cache.batch_select_indices(index)
        batch.mask = batch.mask[index]
        start = leading_padding(batch.mask) if self.mergeable else 0
        if start:  # padding no row needs any more: cut it from the cache and the mask alike
            for layer in batch.cache.layers:
                # transformers types a layer as a union (linear-attention layers hold no keys) whose
                # keys are None until filled; a mergeable cache is all filled DynamicLayers.
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]  # type: ignore[union-attr, index]
            batch.mask = batch.mask[:, start:]

    def merge(self, a: HFBatch, b: HFBatch, room: int) -> HFBatch:
        """One batch of a's rows then b's, left-padded to a common length (plain dynamic caches
        only)."""
        width = max(a.mask.shape[1], b.mask.shape[1])
        for layer_a, layer_b in zip(a.cache.layers, b.cache.layers, strict=True):
            # As in select_rows: typed as a union with optional keys, here always filled
            # DynamicLayers.
            layer_a.keys = torch.cat([pad_left(layer_a.keys, width), pad_left(layer_b.keys, width)])  # type: ignore[union-attr, arg-type]
            values = [pad_left(layer_a.values, width), pad_left(layer_b.values, width)]  # type: ignore[union-attr, arg-type]
            layer_a.values = torch.cat(values)  # type: ignore[union-attr]
        return HFBatch(
            a.cache, torch.cat([left_pad_mask(a.mask, width), left_pad_mask(b.mask, width)])
        )

    def hidden_states(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Final normalised hidden states `[B, T, d]` of left-padded prompts, with their mask."""
        input_ids, mask = left_pad(prompts, self.device)
        body = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        out = body(
            input_ids=input_ids, attention_mask=mask, position_ids=positions(mask), use_cache=False
        )
        return out.last_hidden_state, mask
