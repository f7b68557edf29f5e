"""Steering on llama.cpp: a row's residual additions as one control vector per layer.

An SAE feature's delta at layer L is a vector added to the residual after block L, which is what
llama.cpp's control vectors add (`llama_set_adapter_cvec`, applied at the end of every block from
1 to n_layer - 1). A control vector belongs to the whole context, not to a row, so the runner
decodes the rows of a step in groups, one group per distinct edit (an unsteered group first,
with the vector off); `ControlVectors` turns each row's edit into its group's flat buffer, once
per edit. What a control vector cannot express is refused with a 400 naming it: operations
(clamps and other functions of the residual), additions before block 0 or after block 0
(llama.cpp keeps no vector there), and residual reads (no evaluation callback is wired).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from millm.engine.residual import ResidualEdit, Tap
from millm.errors import FieldNotHonoured

ENGINE = "llama.cpp"


@dataclass(frozen=True, eq=False)
class Vector:
    """One edit's control vector: `data` holds layers 1..n_layer-1 back to back (float32), applied over [start, end]."""

    data: np.ndarray
    start: int
    end: int


def engine_cannot(what: str, param: str = "steering") -> FieldNotHonoured:
    """The 400 for something the llama.cpp engine cannot do, saying how to get it."""
    return FieldNotHonoured(
        f"{what} cannot be honoured on a model served by {ENGINE}; load it with --engine transformers "
        "(MILLM_ENGINE) for this",
        param=param,
    )


class ControlVectors:
    """The llama.cpp engine's residual editor: the same stack / install / clear as ResidualEditor,
    holding per row the control vector (or None) the runner applies when it decodes that row."""

    def __init__(self, layers: int, width: int):
        self.layers, self.width = layers, width
        self._vectors: dict[
            int, Vector | None
        ] = {}  # id(edit) -> its vector; kept while the edit lives
        self._edits: dict[int, ResidualEdit] = {}
        self.current: list[Vector | None] = []

    def vector(self, edit: ResidualEdit | None) -> Vector | None:
        """The control vector doing what `edit` does (None: unsteered), or a 400 when it cannot."""
        if edit is None:
            return None
        key = id(edit)
        if key in self._vectors and self._edits[key] is edit:
            return self._vectors[key]
        if edit.operations:
            raise engine_cannot(
                "a steering operation (a clamp or another function of the residual)"
            )
        data = np.zeros((self.layers - 1, self.width), dtype=np.float32)
        points = sorted(edit.points)
        if not points:
            return None
        for point in points:
            if not 1 <= point < self.layers:
                where = "before block 0" if point < 0 else f"after block {point}"
                raise engine_cannot(
                    f"steering {where} (llama.cpp adds control vectors after blocks 1..{self.layers - 1} only)"
                )
            vector = edit.vector(point)
            assert vector is not None  # an addition's point has a vector
            data[point - 1] = vector.detach().float().cpu().numpy()
        made = Vector(np.ascontiguousarray(data.reshape(-1)), points[0], points[-1])
        if len(self._vectors) > 256:  # edits come and go with requests; keep the cache bounded
            self._vectors.clear()
            self._edits.clear()
        self._vectors[key], self._edits[key] = made, edit
        return made

    def stack(self, edits: list[ResidualEdit | None]) -> list[Vector | None]:
        """Each row's control vector (a 400 if any edit cannot be one)."""
        return [self.vector(edit) for edit in edits]

    def install(
        self,
        stacked: list[Vector | None] | None,
        taps: dict[int, Tap] | None = None,
        real: list[int] | None = None,
    ) -> None:
        """Use these rows' vectors for the next decodes; readers cannot be served here."""
        if taps:
            raise engine_cannot(
                "reading the residual stream (return_sae_activations, monitoring, probes)",
                "return_sae_activations",
            )
        self.current = list(stacked or [])

    def set_rows(self, edits: list[ResidualEdit | None]) -> None:
        """Stack the rows' vectors and use them for the next decodes."""
        self.install(self.stack(edits))

    def clear(self) -> None:
        """Nothing added: the next decodes are unsteered."""
        self.current = []

    def groups(self, rows: int) -> list[tuple[Vector | None, list[int]]]:
        """The rows of the next decode grouped by their vector, unsteered rows first."""
        by_vector: dict[int, tuple[Vector | None, list[int]]] = {}
        for row in range(rows):
            vector = self.current[row] if row < len(self.current) else None
            by_vector.setdefault(id(vector) if vector is not None else 0, (vector, []))[1].append(
                row
            )
        return sorted(by_vector.values(), key=lambda group: group[0] is not None)
