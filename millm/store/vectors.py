"""Stored steering vectors: one row each, the unit direction as little-endian float32 bytes."""

from __future__ import annotations

import numpy as np
from sqlalchemy import delete, insert, select

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import vectors_table

table = vectors_table
FLOAT32 = np.dtype("<f4")  # the stored byte order, whatever the machine's


def vector_rows(store: Store, ids: list[str] | None = None) -> list[dict]:
    """Every stored vector (or those of `ids`), oldest first; `unit` as a read-only float32
    array."""
    query = select(table).order_by(table.c.created_at)
    if ids is not None:
        query = query.where(table.c.id.in_(ids))
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return [{**row._mapping, "unit": np.frombuffer(row.unit, dtype=FLOAT32)} for row in rows]


def insert_vector(store: Store, row: dict) -> None:
    """Store a vector (row: the table's columns, `unit` a float32 array of d_model values)."""
    with store.transaction(Topic.VECTORS) as conn:
        conn.execute(
            insert(table).values(
                {**row, "unit": np.ascontiguousarray(row["unit"], dtype=FLOAT32).tobytes()}
            )
        )


def delete_vector(store: Store, vector_id: str) -> None:
    """Forget a vector."""
    with store.transaction(Topic.VECTORS) as conn:
        conn.execute(delete(table).where(table.c.id == vector_id))
