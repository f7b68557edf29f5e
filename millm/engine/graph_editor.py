"""Steering and reading on llama.cpp: the residual editor that works inside llama.cpp's graph.

The same stack / install / clear as ResidualEditor (residual.py), applied where llama.cpp's own
graph names the values: a block's output (`l_out-L`), a block's MLP input (`ffn_norm-L`, the
norm's output, what a transcoder reads) and the residual before block 0 (the token embeddings,
`embd`, or `inp_scaled` where the family scales them). The graph callback (graph_callback.py)
stops at each hooked node of a decode, whose values `[n, d]` are the tokens of one llama.cpp
micro-batch back to back; the runner says before each decode which batch row and which of the
row's columns each token is (`chunk`), so every row gets its own addition, its own operations
and its own readers in **one** decode, whatever mix of plans the rows carry.

A point without operations is served natively (no Python inside the decode): its values are
copied to a buffer and each token's row's addition, gathered here before the decode, is added in
C. A point with operations calls `at_node`, which adds, operates and keeps what readers need.
Readers (taps) see a whole pass: their values are kept across a pass's micro-batches and handed
over, left-padded `[B, T, d]` as the transformers runners hand them, when the pass ends.

llama.cpp computes its last block for the rows whose logits are asked only; a pass that edits or
reads that block asks logits for every token (`every_output`), and the runner drops the extra.
"""

from __future__ import annotations

import numpy as np
import torch

from millm.engine.graph_callback import Buffers, GraphHooks
from millm.engine.residual import (
    EMBEDDINGS,
    MLP_INPUTS,
    ResidualEdit,
    Stacked,
    Tap,
    operations_by_point,
    run_operation,
    source_points,
)

# Families whose llama.cpp graph scales the embeddings before block 0 (the scaled ones are the
# residual).
SCALED_EMBEDDINGS = ("gemma",)


def node_name(point: int, model_type: str) -> str:
    """llama.cpp's name for the graph node holding `point`'s values."""
    if point == EMBEDDINGS:  # "inp_embd" is the input of embeddings given as vectors, not tokens'
        return "inp_scaled" if model_type.startswith(SCALED_EMBEDDINGS) else "embd"
    if point >= MLP_INPUTS:
        return f"ffn_norm-{point - MLP_INPUTS}"
    return f"l_out-{point}"


class GraphEditor:
    """Owns the rows' stacked edits and readers of the next passes on llama.cpp (scheduler thread
    only)."""

    taps_mlp_inputs = True

    def __init__(self, layers: int, width: int, model_type: str):
        self.layers, self.width, self.model_type = layers, width, model_type
        self._current = Stacked()
        self._taps: dict[int, Tap] = {}
        self._points: list[int] = []  # the hooked points, in the order of the callback's names
        self._hooks: GraphHooks | None = None  # the callback of the runner's context
        # one pass: each row's column count; the taps' values so far
        self._counts: list[int] = []
        self._kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # one micro-batch: each token's row and column, each row's slice of the tokens
        self._rows = np.zeros(0, dtype=np.int64)
        self._columns = np.zeros(0, dtype=np.int64)
        self._slices: dict[int, slice] = {}
        self._seen: dict[int, torch.Tensor] = {}
        self._buffers: dict[int, Buffers] = {}  # natively served hooks' buffers, by hook index

    def bind(self, hooks: GraphHooks) -> None:
        """The callback this editor drives (told the nodes whenever the points in use change)."""
        self._hooks = hooks
        self._rehook()

    # what the engine asks of an editor --------------------------------------------------------
    def stack(self, edits: list[ResidualEdit | None]) -> Stacked:
        """The rows' vectors per point `[B, d]` float32 (zeros for rows without one), and their
        operations."""
        present = [edit for edit in edits if edit is not None]
        additions = {}
        for point in {point for edit in present for point, _ in edit.additions}:
            self._check(point)
            rows = torch.zeros(len(edits), self.width)
            for i, edit in enumerate(edits):
                vector = edit.vector(point) if edit is not None else None
                if vector is not None:
                    rows[i] = vector.detach().float().cpu()
            additions[point] = rows
        operations, sources = operations_by_point(edits), source_points(edits)
        for point in {*operations, *sources}:
            self._check(point)
        return Stacked(additions, operations, sources)

    def install(
        self,
        stacked: Stacked | None,
        taps: dict[int, Tap] | None = None,
        real: list[int] | None = None,
    ) -> None:
        """Make `stack(...)`'s result the edits of the next passes and `taps` their readers
        (`real` is for left-padded runners: llama.cpp's rows carry no padding)."""
        self._current = stacked if stacked is not None else Stacked()
        for point in taps or {}:
            self._check(point)
        self._taps = dict(taps or {})
        self._rehook()

    def set_rows(self, edits: list[ResidualEdit | None]) -> None:
        """Stack the rows' vectors and use them for the next passes."""
        self.install(self.stack(edits))

    def clear(self) -> None:
        """No edits and no readers: the next passes run llama.cpp's graph undisturbed."""
        self.install(None)

    # what the runner asks -----------------------------------------------------------------------
    @property
    def every_output(self) -> bool:
        """Whether a point in use lies in the last block, which llama.cpp computes for output
        rows only."""
        last = {self.layers - 1, MLP_INPUTS + self.layers - 1}
        return any(point in last for point in self._points)

    @property
    def active(self) -> bool:
        """Whether the next passes stop anywhere in the graph."""
        return bool(self._points)

    def begin_pass(self, counts: list[int]) -> None:
        """A pass begins: row i brings counts[i] tokens (its columns 0..counts[i]-1)."""
        self._counts = counts
        self._kept = {}

    def chunk(self, rows: np.ndarray, columns: np.ndarray) -> None:
        """The next decode's tokens: each one's batch row and column (rows in order, each row's
        tokens together); natively served points get their buffers and gathered additions."""
        self._rows, self._columns = rows, columns
        self._seen = {}
        self._slices = {}
        for i, row in enumerate(rows.tolist()):
            found = self._slices.get(row)
            self._slices[row] = slice(i, i + 1) if found is None else slice(found.start, i + 1)
        self._buffers = {}
        shape = (len(rows), self.width)
        for index, point in enumerate(self._points):
            if point in self._current.operations:
                continue  # served by at_node
            added = self._current.additions.get(point)
            buffers = Buffers(np.empty(shape, dtype=np.float32))
            if added is not None:
                buffers.add = np.ascontiguousarray(added.numpy()[rows])
                buffers.after = np.empty(shape, dtype=np.float32)
            self._buffers[index] = buffers
            if point in self._current.sources:
                # the C side fills it before any later node's operation reads it
                self._seen[point] = torch.from_numpy(
                    buffers.after if buffers.after is not None else buffers.before
                )
        if self._hooks is not None:
            self._hooks.arm(len(rows), self.width, self._buffers)

    def decoded(self) -> None:
        """The decode is done: what natively served points read is kept for their taps."""
        for index, buffers in self._buffers.items():
            point = self._points[index]
            if point in self._taps:
                before = torch.from_numpy(buffers.before)
                after = before if buffers.after is None else torch.from_numpy(buffers.after)
                self._keep(point, before, after)
        self._buffers = {}

    def end_pass(self) -> None:
        """The pass is over: each tap reads its point, the rows' columns right-aligned `[B, T,
        d]`."""
        kept, self._kept = self._kept, {}
        for point, (before, after) in kept.items():
            self._taps[point](before, after)

    def bypass(self) -> None:
        """The next decodes run undisturbed (embeddings): the edits stay installed for later
        passes."""
        if self._hooks is not None:
            self._hooks.hook([])

    def restore(self) -> None:
        """Stop where the installed edits and readers need again (after `bypass`)."""
        self._rehook()

    def at_node(self, index: int, values: np.ndarray) -> np.ndarray | None:
        """The callback's handler: the hooked point's values `[n, d]` of this decode, rewritten
        or None."""
        point = self._points[index]
        hidden = torch.from_numpy(values).view(-1, self.width)
        if hidden.shape[0] != len(self._rows):
            raise RuntimeError(
                f"llama.cpp's node {node_name(point, self.model_type)} holds {hidden.shape[0]} "
                f"rows where this decode has {len(self._rows)} tokens"
            )
        edited = self._edited(point, hidden)
        if point in self._taps:
            self._keep(point, hidden, hidden if edited is None else edited)
        if point in self._current.sources:
            self._seen[point] = hidden if edited is None else edited
        return None if edited is None else edited.numpy()

    # inside -------------------------------------------------------------------------------------
    def _check(self, point: int) -> None:
        block = point - MLP_INPUTS if point >= MLP_INPUTS else point
        if point != EMBEDDINGS and not 0 <= block < self.layers:
            raise ValueError(
                f"the model has blocks 0..{self.layers - 1}; point {point} is none of them"
            )

    def _rehook(self) -> None:
        current = self._current
        points = (
            set(current.additions)
            | set(current.operations)
            | set(current.sources)
            | set(self._taps)
        )
        self._points = sorted(points)
        if self._hooks is not None:
            self._hooks.hook(
                [
                    (node_name(point, self.model_type), point in current.operations)
                    for point in self._points
                ]
            )

    def _edited(self, point: int, hidden: torch.Tensor) -> torch.Tensor | None:
        """The values after this point's additions and operations (None: unchanged)."""
        added = self._current.additions.get(point)
        edited = None if added is None else hidden + added[torch.from_numpy(self._rows)]
        operated = self._current.operations.get(point)
        if operated:
            edited = hidden.clone() if edited is None else edited
            for row, operations in operated:
                where = self._slices.get(row)
                if where is None:  # the row has no token in this micro-batch
                    continue
                part = edited[where]
                for operation in operations:
                    part = run_operation(operation, part, self._seen, where)
                edited[where] = part
        return edited

    def _keep(self, point: int, before: torch.Tensor, after: torch.Tensor) -> None:
        """Place this micro-batch's tokens at their rows' right-aligned columns of the pass's
        buffers."""
        if point not in self._kept:
            shape = (len(self._counts), max(self._counts), self.width)
            kept_before = torch.zeros(shape)
            edits = point in self._current.additions or point in self._current.operations
            self._kept[point] = (kept_before, torch.zeros(shape) if edits else kept_before)
        kept_before, kept_after = self._kept[point]
        counts = torch.tensor(self._counts)[torch.from_numpy(self._rows)]
        rows = torch.from_numpy(self._rows)
        columns = torch.from_numpy(self._columns) + (kept_before.shape[1] - counts)
        kept_before[rows, columns] = before
        if kept_after is not kept_before:
            kept_after[rows, columns] = after
