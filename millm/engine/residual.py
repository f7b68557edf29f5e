"""Per-row additions to the residual stream: the engine's half of steering.

A row may carry a `ResidualEdit`: vectors to add to the residual stream after given decoder
blocks, at every position. The engine installs one forward hook per edited point (once, then
kept) and, whenever the rows of the running batch change, stacks each row's vector into a
`[B, 1, d]` tensor, zeros for rows without one. Adding zeros leaves a row bit-identical to an
unsteered run, so steered and unsteered rows can share a batch; a forward pass with no edits
(embeddings, scoring) runs as if no hook existed.

What the vectors are (Σ s_i · W_dec[i] of attached SAEs) is decided outside the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EMBEDDINGS = -1  # the residual before block 0 (resid_pre of layer 0)


@dataclass(frozen=True, eq=False)
class ResidualEdit:
    """Immutable: ((after_block, vector[d]), ...); after_block -1 means before block 0."""

    additions: tuple[tuple[int, torch.Tensor], ...]

    @property
    def points(self) -> set[int]:
        """Where this edit adds something."""
        return {point for point, _ in self.additions}

    def vector(self, point: int) -> torch.Tensor | None:
        """The sum of this edit's vectors at `point`, or None."""
        vectors = [v for p, v in self.additions if p == point]
        if not vectors:
            return None
        return vectors[0] if len(vectors) == 1 else torch.stack(vectors).sum(0)


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder blocks of a transformers causal LM, wherever its family keeps them."""
    for path in ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList):
            return module
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


class ResidualEditor:
    """Owns the hooks and the current batch's stacked vectors (used only on the scheduler thread)."""

    def __init__(self, model, dtype: torch.dtype, device: torch.device):
        self.layers = decoder_layers(model)
        self.dtype, self.device = dtype, device
        self._current: dict[int, torch.Tensor] = {}
        self._hooks: dict[int, object] = {}

    def _hook(self, point: int) -> None:
        if point in self._hooks:
            return
        if point == EMBEDDINGS:
            self._hooks[point] = self.layers[0].register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        else:
            self._hooks[point] = self.layers[point].register_forward_hook(self._make_post_hook(point))

    def _make_post_hook(self, point: int):
        def hook(module, args, output):
            delta = self._current.get(point)
            if delta is None:
                return None
            if isinstance(output, tuple):  # families whose blocks still return (hidden, ...)
                return (output[0] + delta[: output[0].shape[0]], *output[1:])
            return output + delta[: output.shape[0]]

        return hook

    def _pre_hook(self, module, args, kwargs):
        delta = self._current.get(EMBEDDINGS)
        if delta is None:
            return None
        if args:
            return (args[0] + delta[: args[0].shape[0]], *args[1:]), kwargs
        kwargs = dict(kwargs)
        kwargs["hidden_states"] = kwargs["hidden_states"] + delta[: kwargs["hidden_states"].shape[0]]
        return args, kwargs

    def stack(self, edits: list[ResidualEdit | None]) -> dict[int, torch.Tensor]:
        """The rows' vectors stacked per point, `[B, 1, d]` (zeros for rows without an edit)."""
        points = set().union(*(edit.points for edit in edits if edit is not None)) if edits else set()
        current = {}
        for point in points:
            self._hook(point)
            vectors = [edit.vector(point) if edit is not None else None for edit in edits]
            zeros = torch.zeros(next(v for v in vectors if v is not None).shape[-1])
            stacked = torch.stack([(zeros if v is None else v).float().to(self.device) for v in vectors])
            current[point] = stacked.to(self.dtype)[:, None, :]
        return current

    def install(self, stacked: dict[int, torch.Tensor]) -> None:
        """Make `stack(...)`'s result the additions of the next forward passes."""
        self._current = stacked

    def set_rows(self, edits: list[ResidualEdit | None]) -> None:
        """Stack the rows' vectors and use them for the next forward passes."""
        self.install(self.stack(edits))

    def clear(self) -> None:
        """No additions: the next forward passes are unsteered."""
        self._current = {}
