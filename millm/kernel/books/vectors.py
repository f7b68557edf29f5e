"""Stored steering vectors: create (from a training job or an import), read, export, delete, and
resolve one for a plan on the loaded model.

Reads come from memory (a `Shelf`, see base.py), so a plan naming a vector never reads the
database; each vector keeps its unit direction as float32 numpy and as a torch tensor (made once,
shared read-only by every plan). At most MAX_VECTORS are kept.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import torch
from pydantic import BaseModel

from millm.engine.loader import LoadedModel
from millm.errors import Conflict, InvalidRequest, ModelNotLoaded, NotFound
from millm.formats.vector_file import VectorFile, file_of, values_of
from millm.interp.steering import residual_point
from millm.kernel.books.base import Book, unique_name
from millm.store.database import Store
from millm.store.vectors import delete_vector, insert_vector, vector_rows


class VectorView(BaseModel):
    """A stored steering vector (its values come with the export)."""

    id: str
    object: str = "vector"
    name: str
    description: str
    model: str  # the served model name it was trained on; it applies to that model only
    d_model: int
    layer: int
    hook_point: str
    method: str
    pairs: int
    norm: float  # the trained length: a strength of `norm` adds the mean difference
    agreement: float | None  # fraction of pairs whose difference points along it (null: imported)
    created_at: float


class VectorList(BaseModel):
    """Every stored vector, oldest first."""

    object: str = "list"
    data: list[VectorView]


class VectorDeleted(BaseModel):
    """What DELETE /api/vectors/{id} removed."""

    id: str
    object: str = "vector.deleted"
    name: str
    deleted: bool = True


NOT_APPLICABLE = "vector_not_applicable"
MAX_VECTORS = 1000  # stored vectors (each d_model float32 in memory: 16 MB at d_model 4096)
PREFIX = "vec_"


def model_width(lm: LoadedModel) -> int:
    """The model's residual width (what an SAE's d_in and a vector's d_model must equal)."""
    return int(lm.config.hidden_size)


class VectorBook(Book):
    """Steering vectors in the store, found by id or by name (names are unique)."""

    def __init__(self, store: Store, limit: int = MAX_VECTORS):
        self.store, self.limit = store, limit
        super().__init__()

    # Book -----------------------------------------------------------------------------------------
    def _rows(self, ids: list[str] | None = None) -> list[dict]:
        return vector_rows(self.store, ids)

    def _parse(self, row: dict) -> dict:
        # float32 [d_model], never written to
        return {"tensor": torch.from_numpy(row["unit"].copy())}

    def _order(self, row: dict) -> object:
        return row["created_at"]

    def _missing(self, key: str) -> NotFound:
        return NotFound(
            f"no steering vector named or with id {key!r}",
            param="vector_id",
            code="vector_not_found",
        )

    # writes ---------------------------------------------------------------------------------------
    def create(self, meta: dict, unit: np.ndarray, on_conflict: str = "fail") -> dict:
        """Store a vector (meta: name, description, model, d_model, layer, hook_point, method,
        pairs, norm, agreement); a taken name is 409 vector_exists, or renamed (name-2, ...) with
        on_conflict 'rename'."""
        vector_id = PREFIX + uuid.uuid4().hex[:12]
        with self.writing() as touched:
            shelf = self.shelf
            if len(shelf.rows) >= self.limit:
                raise Conflict(
                    f"{len(shelf.rows)} steering vectors are stored, the most this server keeps; "
                    "delete one first",
                    code="vectors_full",
                )
            name = meta["name"]
            if name in shelf.by_name:
                if on_conflict != "rename":
                    raise Conflict(
                        f"a steering vector named {name!r} exists; choose another name",
                        param="name",
                        code="vector_exists",
                    )
                name = unique_name(name, shelf.names())
            touched.add(vector_id)
            insert_vector(
                self.store,
                {**meta, "name": name, "id": vector_id, "unit": unit, "created_at": time.time()},
            )
        return self.find(vector_id)

    def import_file(self, document: VectorFile, on_conflict: str) -> VectorView:
        """Store a validated vector file (its values bit for bit)."""
        meta = document.model_dump(exclude={"kind", "version", "normalisation", "values"})
        return self.view(self.create({**meta, "agreement": None}, values_of(document), on_conflict))

    def delete(self, key: str) -> VectorDeleted:
        """Forget a vector; plans resolved after this refuse it."""
        with self.writing() as touched:
            row = self.find(key)
            touched.add(row["id"])
            delete_vector(self.store, row["id"])
        return VectorDeleted(id=row["id"], name=row["name"])

    # reads ----------------------------------------------------------------------------------------
    @staticmethod
    def view(row: dict) -> VectorView:
        """A stored vector as the API shows it."""
        return VectorView(
            **{key: value for key, value in row.items() if key in VectorView.model_fields}
        )

    def get(self, key: str) -> VectorView:
        """One vector by id or name (404 vector_not_found)."""
        return self.view(self.find(key))

    def list(self) -> VectorList:
        """Every vector, oldest first."""
        return VectorList(data=[self.view(row) for row in self.shelf.rows])

    def export(self, key: str) -> dict:
        """The vector's file (formats/vector_file.py)."""
        row = self.find(key)
        return file_of(row, row["unit"])

    # plans ----------------------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        """Moves with every change to the vectors (part of a cached plan's state stamp)."""
        return self.shelf.revision

    def vector(self, vector_id: str, lm: LoadedModel | None) -> tuple[int, torch.Tensor] | None:
        """The VectorResolver of plans (kernel/steering/resolution.py): (the engine's residual
        point, the unit direction float32 [d_model] on the model's device) of a vector by id or
        name; None when none is stored; 400 vector_not_applicable when it was trained on another
        model (name or width) or its layer is past the model's depth; 503 model_not_loaded with
        no model."""
        shelf = self.shelf
        row = shelf.get(vector_id)
        if row is None:
            return None
        if lm is None:
            raise ModelNotLoaded(
                f"no model is loaded to apply steering vector {row['name']!r} ({row['id']}) to",
                param="vector_id",
            )
        width = model_width(lm)
        if row["model"] != lm.name or row["d_model"] != width:
            raise InvalidRequest(
                f"steering vector {row['name']!r} ({row['id']}) was trained on model "
                f"{row['model']!r} (d_model {row['d_model']}), not on the loaded model "
                f"{lm.name!r} (d_model {width}); a vector applies only to the model it was "
                "trained on",
                param="vector_id",
                code=NOT_APPLICABLE,
            )
        depth = int(lm.config.num_hidden_layers)
        if not 0 <= row["layer"] < depth:
            raise InvalidRequest(
                f"steering vector {row['name']!r} ({row['id']}) is at layer {row['layer']}, past "
                f"{lm.name}'s {depth} layers",
                param="vector_id",
                code=NOT_APPLICABLE,
            )
        return residual_point(row["layer"], row["hook_point"]), shelf.documents[row["id"]][
            "tensor"
        ].to(lm.device)
