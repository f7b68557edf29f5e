"""The logit lens: what each block's residual stream would predict if the model stopped there.

Each chosen block's output, at every position of one pass, goes through the model's own final
norm and output head (its final soft-cap too, Gemma's), and a softmax over the vocabulary. The
residuals are captured by reads (reading.py) and kept on the scheduler thread; the last read
(the last block's, which is the model's own prediction) turns them all into the table, so no
vocabulary-sized tensor leaves that thread: per layer and position the top-k tokens with their
probabilities, and the probability of the token the model finally predicts there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from millm.engine.jobs import ResidualRead
from millm.engine.loader import LoadedModel

TAG = "lens"


@dataclass(frozen=True)
class LensTable:
    """Per chosen layer (rows) and position (columns): the top-k ids and probabilities, and the
    probability of each position's final prediction (`final_ids`, the last block's top token,
    which the model gives `final_prob`)."""

    layers: tuple[int, ...]
    top_ids: list[list[list[int]]]
    top_probs: list[list[list[float]]]
    final_ids: list[int]
    final_prob: list[float]
    final_probs: list[list[float]]


def lens_head(lm: LoadedModel) -> tuple[Callable, Callable]:
    """The model's final norm and head logits: the lean runner's own (its kernel and final
    soft-cap), or on llama.cpp the file's, dequantised (gguf_head.py). ValueError elsewhere."""
    head = getattr(lm.runner, "lens_head", None)
    if head is not None:
        return head.final_norm, head.head_logits
    found = getattr(lm.runner, "layout", None)
    if found is None:
        raise ValueError(f"millm does not know the final norm and head of {lm.config.model_type}")
    return found.final_norm, lm.runner.head_logits  # type: ignore[attr-defined]  # a lean runner's, as found is


def read_lens_head(lm: LoadedModel) -> None:
    """Dequantise llama.cpp's final norm and head now, if not yet (blocking: seconds for a large
    vocabulary), so the scheduler thread, where the lens's last read runs, never waits for it."""
    head = getattr(lm.runner, "lens_head", None)
    if head is not None:
        head.tensors()


def lens_reads(lm: LoadedModel, layers: list[int], top_k: int) -> tuple[ResidualRead, ...]:
    """Reads of every prompt position after each of `layers` (after any steering there); the last
    one's `encoded` is the LensTable. ValueError for a family whose final norm millm does not
    know."""
    final_norm, head_logits = lens_head(lm)
    last = int(lm.config.num_hidden_layers) - 1
    points = sorted(set(layers) | {last})
    kept: dict[int, torch.Tensor] = {}

    def logprobs(residuals: torch.Tensor) -> torch.Tensor:
        hidden = final_norm(residuals.to(device=lm.device, dtype=lm.dtype))
        return torch.log_softmax(head_logits(hidden), dim=-1)

    def table() -> LensTable:
        best_final = logprobs(kept[last]).max(dim=-1)
        final = best_final.indices
        top_ids, top_probs, final_probs = [], [], []
        for point in sorted(layers):
            scored = logprobs(kept[point])
            best = scored.topk(top_k, dim=-1)
            top_ids.append(best.indices.cpu().tolist())
            top_probs.append(best.values.exp().cpu().tolist())
            final_probs.append(scored.gather(1, final[:, None])[:, 0].exp().cpu().tolist())
        return LensTable(
            tuple(sorted(layers)),
            top_ids,
            top_probs,
            final.cpu().tolist(),
            best_final.values.exp().cpu().tolist(),
            final_probs,
        )

    def keeper(point: int):
        def encode(residuals: torch.Tensor) -> LensTable | None:
            kept[point] = residuals
            if point != points[-1]:
                return None
            with torch.inference_mode():
                return table()

        return encode

    return tuple(ResidualRead(p, True, "prompt", TAG, encode=keeper(p)) for p in points)
