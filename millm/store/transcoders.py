"""The transcoder sets' table: each registered set's id and the directory its files lie in."""

from __future__ import annotations

import time

from sqlalchemy import delete, insert, select

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import transcoder_sets_table

table = transcoder_sets_table


def transcoder_set_rows(store: Store, ids: list[str] | None = None) -> list[dict]:
    """Every registered set (or those of `ids`): {id, path, created_at}, oldest first."""
    query = select(table).order_by(table.c.created_at)
    if ids is not None:
        query = query.where(table.c.id.in_(ids))
    with store.reading() as conn:
        rows = conn.execute(query).all()
    return [{"id": r.id, "path": r.path, "created_at": r.created_at} for r in rows]


def insert_transcoder_set(store: Store, set_id: str, path: str) -> None:
    """Store a newly registered set."""
    values = {"id": set_id, "path": path, "created_at": time.time()}
    with store.transaction(Topic.TRANSCODERS) as conn:
        conn.execute(insert(table).values(**values))


def delete_transcoder_set(store: Store, set_id: str) -> None:
    """Forget a set (its files stay where they are)."""
    with store.transaction(Topic.TRANSCODERS) as conn:
        conn.execute(delete(table).where(table.c.id == set_id))
