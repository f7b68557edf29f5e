"""The clusters' and circuits' tables: imported miStudio documents, stored raw (a cluster with its
persistent dial). One set of functions serves both, by table name; a deleted one's sensing goes
with it."""

from __future__ import annotations

import time

from sqlalchemy import Table, delete, insert, select, update

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import circuits_table, clusters_table
from millm.store.sensing import forget_base


def _table(table: str) -> Table:
    return clusters_table if table == "clusters" else circuits_table


def _topic(table: str) -> Topic:
    return Topic.CLUSTERS if table == "clusters" else Topic.CIRCUITS


def document_rows(store: Store, table: str, ids: list[str] | None = None) -> list[dict]:
    """Rows of the clusters or circuits table (or those of `ids`), oldest first."""
    target = _table(table)
    query = select(target).order_by(target.c.created_at)
    if ids is not None:
        query = query.where(target.c.id.in_(ids))
    with store.reading() as conn:
        rows = conn.execute(query).all()
    return [dict(row._mapping) for row in rows]


def insert_documents(store: Store, table: str, rows: list[dict]) -> None:
    """Add cluster or circuit rows in one transaction: all or none."""
    now = time.time()
    with store.transaction(_topic(table)) as conn:
        conn.execute(
            insert(_table(table)),
            [{**row, "created_at": now + i * 1e-6} for i, row in enumerate(rows)],
        )


def delete_document(store: Store, table: str, document_id: str) -> None:
    """Remove a cluster or circuit."""
    target = _table(table)
    with store.transaction(_topic(table)) as conn:
        conn.execute(delete(target).where(target.c.id == document_id))
        forget_base(conn, document_id)  # its sensing switch and events go with it


def set_document_intensity(store: Store, table: str, document_id: str, intensity: float) -> None:
    """Store a cluster's or a circuit's persistent dial."""
    target = _table(table)
    with store.transaction(_topic(table)) as conn:
        conn.execute(update(target).where(target.c.id == document_id).values(intensity=intensity))
