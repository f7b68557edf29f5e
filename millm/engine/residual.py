"""Per-row additions to the residual stream: the engine's half of steering.

A row may carry a `ResidualEdit`: vectors to add to the residual stream after given decoder
blocks, at every position. The engine installs one forward hook per edited point (once, then
kept) and, whenever the rows of the running batch change, stacks each row's vector into a
`[B, 1, d]` tensor, zeros for rows without one. Adding zeros leaves a row bit-identical to an
unsteered run, so steered and unsteered rows can share a batch; a forward pass with no edits
(embeddings, scoring) runs as if no hook existed.

A lane may also install *taps*: readers that see a point's residual before and after its
additions (what `return_sae_activations` and monitoring encode). What the vectors are
(Σ s_i · W_dec[i] of attached SAEs) and what a read residual means is decided outside the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

EMBEDDINGS = -1  # the residual before block 0 (resid_pre of layer 0)
# A reader of one point: called with the residual `[B, T, d]` before and after the point's additions.
Tap = Callable[[torch.Tensor, torch.Tensor], None]


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
        self._taps: dict[int, Tap] = {}
        self._hooks: dict[int, object] = {}

    def _hook(self, point: int) -> None:
        if point in self._hooks:
            return
        if point == EMBEDDINGS:
            self._hooks[point] = self.layers[0].register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        else:
            self._hooks[point] = self.layers[point].register_forward_hook(self._make_post_hook(point))

    def _edited(self, point: int, hidden: torch.Tensor) -> torch.Tensor | None:
        """The residual after this point's additions (None: unchanged), reporting both to a tap."""
        delta = self._current.get(point)
        edited = None if delta is None else hidden + delta[: hidden.shape[0]]
        tap = self._taps.get(point)
        if tap is not None:
            tap(hidden, hidden if edited is None else edited)
        return edited

    def _make_post_hook(self, point: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output  # some families return (hidden, ...)
            edited = self._edited(point, hidden)
            if edited is None:
                return None
            return (edited, *output[1:]) if isinstance(output, tuple) else edited

        return hook

    def _pre_hook(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        edited = self._edited(EMBEDDINGS, hidden)
        if edited is None:
            return None
        if args:
            return (edited, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": edited}

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

    def install(self, stacked: dict[int, torch.Tensor], taps: dict[int, Tap] | None = None) -> None:
        """Make `stack(...)`'s result the additions of the next forward passes, and `taps` their readers."""
        self._current = stacked
        taps = taps or {}
        for point in taps:
            self._hook(point)
        self._taps = taps

    def set_rows(self, edits: list[ResidualEdit | None]) -> None:
        """Stack the rows' vectors and use them for the next forward passes."""
        self.install(self.stack(edits))

    def clear(self) -> None:
        """No additions and no readers: the next forward passes are unsteered and unread."""
        self._current = {}
        self._taps = {}
