"""Per-row edits of the residual stream: the engine's half of steering.

A row may carry a `ResidualEdit`: vectors to add to the residual stream after given decoder
blocks, at every position, and *operations* (functions of the row's residual) applied after a
point's additions. The engine installs one forward hook per edited point (once, then kept) and,
whenever the rows of the running batch change, stacks each row's vector into a `[B, 1, d]`
tensor, zeros for rows without one. Adding zeros leaves a row bit-identical to an unsteered
run, so steered and unsteered rows can share a batch; a forward pass with no edits (embeddings,
scoring) runs as if no hook existed. Operations are kept per batch row and run on that row's
slice only, so rows without one are untouched, and a point without any runs exactly the
additions-only code.

A lane may also install *taps*: readers that see a point's residual before and after its
edits (what `return_sae_activations` and monitoring encode).

Points are ints: EMBEDDINGS, the residual after block L (L), and block L's MLP input
(`mlp_input(L)`: the output of the norm in front of its MLP, what a transcoder reads). An MLP input
is tapped through a forward hook on that norm module, which the lean runner calls as a module too. A
`SourcedOperation` reads another point of the same forward pass besides the one it rewrites: a
transcoder's clamp reads its block's MLP input and rewrites the residual after it. What the vectors
and operations are (Σ s_i · W_dec[i] of attached SAEs, clamps of a feature) and what a read residual
means is decided outside the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

EMBEDDINGS = -1  # the residual before block 0 (resid_pre of layer 0)
# A reader of one point: called with the residual `[B, T, d]` before and after the point's edits.
Tap = Callable[[torch.Tensor, torch.Tensor], None]
# One row's residual at a point, `[T, d]` in the model's dtype, after the point's additions ->
# the rewritten residual `[T, d]`. Runs inside the forward hook on the scheduler thread, once per
# forward pass for each row that carries it (prefill: the row's prompt positions; decode: 1).
Operation = Callable[[torch.Tensor], torch.Tensor]
MLP_INPUTS = 1 << 20  # points from here on are MLP inputs: block (point - MLP_INPUTS)'s


def mlp_input(block: int) -> int:
    """The engine's point for block `block`'s MLP input."""
    return MLP_INPUTS + block


@dataclass(frozen=True, eq=False)
class SourcedOperation:
    """An operation that also reads the values at `source`, a point earlier in the same forward
    pass: apply(row's residual `[T, d]`, the row's values at source `[T, d]`) -> residual."""

    source: int
    apply: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    cache_key: Hashable  # what it does, so rows with equal operations share cached KV


AnyOperation = Operation | SourcedOperation


def run_operation(
    operation: AnyOperation,
    residual: torch.Tensor,
    seen: dict[int, torch.Tensor],
    row: int | slice | tuple[int, slice],
) -> torch.Tensor:
    """One row's residual through `operation`; `seen[point][row]` is the row's values at a point
    earlier in the pass, which a SourcedOperation reads (llama.cpp's passes are flat: a slice)."""
    if isinstance(operation, SourcedOperation):
        return operation.apply(residual, seen[operation.source][row])
    return operation(residual)


@dataclass(frozen=True, eq=False)
class ResidualEdit:
    """Immutable: ((after_block, vector[d]), ...) and ((after_block, operation), ...), the
    operations applied in order after the point's additions; after_block -1 means before block 0."""

    additions: tuple[tuple[int, torch.Tensor], ...]
    operations: tuple[tuple[int, AnyOperation], ...] = ()

    @property
    def points(self) -> set[int]:
        """Where this edit adds or rewrites something."""
        return {point for point, _ in self.additions} | {point for point, _ in self.operations}

    def operations_at(self, point: int) -> tuple[AnyOperation, ...]:
        """This edit's operations at `point`, in the order they apply."""
        return tuple(op for p, op in self.operations if p == point)

    def vector(self, point: int) -> torch.Tensor | None:
        """The sum of this edit's vectors at `point`, or None."""
        vectors = [v for p, v in self.additions if p == point]
        if not vectors:
            return None
        return vectors[0] if len(vectors) == 1 else torch.stack(vectors).sum(0)


def combined(a: ResidualEdit | None, b: ResidualEdit | None) -> ResidualEdit | None:
    """The edit doing both: `a`'s additions and `b`'s, then `a`'s operations and `b`'s (None if
    neither)."""
    if a is None or b is None:
        return a if b is None else b
    return ResidualEdit(a.additions + b.additions, a.operations + b.operations)


def operations_by_point(
    edits: list[ResidualEdit | None],
) -> dict[int, tuple[tuple[int, tuple[AnyOperation, ...]], ...]]:
    """Per point, the batch rows whose edits carry operations there, with those operations in
    order."""
    present = [edit for edit in edits if edit is not None]
    operations = {}
    for point in {point for edit in present for point, _ in edit.operations}:
        carried = [
            (i, edit.operations_at(point)) for i, edit in enumerate(edits) if edit is not None
        ]
        operations[point] = tuple((i, ops) for i, ops in carried if ops)
    return operations


def source_points(edits: list[ResidualEdit | None]) -> frozenset[int]:
    """The points whose values a SourcedOperation of these edits reads."""
    return frozenset(
        op.source
        for edit in edits
        if edit is not None
        for _, op in edit.operations
        if isinstance(op, SourcedOperation)
    )


@dataclass(frozen=True)
class Stacked:
    """A batch's edits ready for the hooks: additions `[B, 1, d]` per point, and per point the
    batch rows that carry operations with the operations in order."""

    additions: dict[int, torch.Tensor] = field(default_factory=dict)
    operations: dict[int, tuple[tuple[int, tuple[AnyOperation, ...]], ...]] = field(
        default_factory=dict
    )
    sources: frozenset[int] = frozenset()  # points whose values a SourcedOperation reads


class Editor(Protocol):
    """What the engine asks of a residual editor (ResidualEditor; GraphEditor on llama.cpp).
    What `stack` returns is the editor's own and only ever goes back to its `install`, hence Any."""

    def stack(self, edits: list[ResidualEdit | None]) -> Any: ...

    def install(
        self, stacked: Any, taps: dict[int, Tap] | None = None, real: list[int] | None = None
    ) -> None: ...

    def clear(self) -> None: ...


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder blocks of a transformers causal LM, wherever its family keeps them."""
    for path in (
        "model.layers",
        "model.language_model.layers",
        "transformer.h",
        "gpt_neox.layers",
        "model.decoder.layers",
    ):
        module = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList):
            return module
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


class ResidualEditor:
    """Owns the hooks and the current batch's stacked vectors (used only on the scheduler thread).

    `mlp_norms`: each block's norm in front of its MLP, where MLP inputs are tapped (None: the
    runner does not know them, and MLP-input points are refused)."""

    def __init__(
        self,
        model,
        dtype: torch.dtype,
        device: torch.device,
        mlp_norms: Sequence[torch.nn.Module] | None = None,
    ):
        self.layers = decoder_layers(model)
        self.mlp_norms = list(mlp_norms) if mlp_norms is not None else None
        self.dtype, self.device = dtype, device
        self._seen: dict[int, torch.Tensor] = {}  # this forward pass's values at the sources
        self._current = Stacked()
        self._real: list[int] | None = (
            None  # real (last) columns of each batch row; None: every column
        )
        self._taps: dict[int, Tap] = {}
        self._hooks: dict[int, object] = {}

    def _hook(self, point: int) -> None:
        if point in self._hooks:
            return
        if point == EMBEDDINGS:
            self._hooks[point] = self.layers[0].register_forward_pre_hook(
                self._pre_hook, with_kwargs=True
            )
        elif point >= MLP_INPUTS:
            if self.mlp_norms is None:
                raise ValueError("this runner cannot tap a block's MLP input")
            self._hooks[point] = self.mlp_norms[point - MLP_INPUTS].register_forward_hook(
                self._make_post_hook(point)
            )
        else:
            self._hooks[point] = self.layers[point].register_forward_hook(
                self._make_post_hook(point)
            )

    def _edited(self, point: int, hidden: torch.Tensor) -> torch.Tensor | None:
        """The residual after this point's edits (None: unchanged), reporting both to a tap."""
        delta = self._current.additions.get(point)
        edited = None if delta is None else hidden + delta[: hidden.shape[0]]
        operated = self._current.operations.get(point)
        if operated:
            edited = self._operate(
                hidden if edited is None else edited, operated, fresh=edited is not None
            )
        tap = self._taps.get(point)
        if tap is not None:
            tap(hidden, hidden if edited is None else edited)
        if point in self._current.sources:
            self._seen[point] = hidden if edited is None else edited
        return edited

    @property
    def taps_mlp_inputs(self) -> bool:
        """Whether MLP-input points can be read and edited here."""
        return self.mlp_norms is not None

    def _operate(
        self,
        hidden: torch.Tensor,
        rows: tuple[tuple[int, tuple[AnyOperation, ...]], ...],
        fresh: bool,
    ) -> torch.Tensor:
        """`hidden` with each listed row's real columns rewritten by its operations, in order."""
        # The forward's own tensor stays as it was: a tap reads it as the residual before the edits.
        edited = hidden if fresh else hidden.clone()
        width = hidden.shape[1]
        for row, operations in rows:
            # Only the row's real columns: a padding column's residual is meaningless, and an
            # operation that saw it would get a different input alone than in a batch.
            start = width - self._real[row] if self._real is not None else 0
            part = edited[row, start:]
            for operation in operations:
                part = run_operation(operation, part, self._seen, (row, slice(start, None)))
            edited[row, start:] = part
        return edited

    def _make_post_hook(self, point: int):
        def hook(module, args, output):
            # some families return (hidden, ...)
            hidden = output[0] if isinstance(output, tuple) else output
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

    def stack(self, edits: list[ResidualEdit | None]) -> Stacked:
        """The rows' vectors stacked per point, `[B, 1, d]` (zeros for rows without an edit), and
        the rows' operations per point."""
        present = [edit for edit in edits if edit is not None]
        additions = {}
        for point in {point for edit in present for point, _ in edit.additions}:
            self._hook(point)
            vectors = [edit.vector(point) if edit is not None else None for edit in edits]
            zeros = torch.zeros(next(v for v in vectors if v is not None).shape[-1])
            stacked = torch.stack(
                [(zeros if v is None else v).float().to(self.device) for v in vectors]
            )
            additions[point] = stacked.to(self.dtype)[:, None, :]
        operations, sources = operations_by_point(edits), source_points(edits)
        for point in {*operations, *sources}:
            self._hook(point)
        return Stacked(additions, operations, sources)

    def install(
        self,
        stacked: Stacked | None,
        taps: dict[int, Tap] | None = None,
        real: list[int] | None = None,
    ) -> None:
        """Make `stack(...)`'s result the edits of the next forward passes, and `taps` their
        readers.

        `real`: how many of each batch row's last columns are real tokens (a left-padded prefill),
        so operations rewrite only those; None when every column is real (a decode step)."""
        self._current = stacked if stacked is not None else Stacked()
        self._seen = {}
        self._real = real
        taps = taps or {}
        for point in taps:
            self._hook(point)
        self._taps = taps

    def set_rows(self, edits: list[ResidualEdit | None]) -> None:
        """Stack the rows' vectors and use them for the next forward passes."""
        self.install(self.stack(edits))

    def clear(self) -> None:
        """No additions and no readers: the next forward passes are unsteered and unread."""
        self._current = Stacked()
        self._seen = {}
        self._real = None
        self._taps = {}
