"""Stored probes: one row per probe, its document as JSON and whether it is active.

Plain SQLAlchemy core, so the same code runs on SQLite and PostgreSQL; every write is one
transaction (an import of a bundle stores all of its probes or none).
"""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, insert, select, update

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import probes_table

table = probes_table


def probe_rows(store: Store, ids: list[str] | None = None) -> list[dict]:
    """Every probe row (or those of `ids`): {id, name, document, active, created_at, updated_at},
    by name."""
    query = select(table).order_by(table.c.name)
    if ids is not None:
        query = query.where(table.c.id.in_(ids))
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        {
            "id": r.id,
            "name": r.name,
            "document": json.loads(r.document),
            "active": bool(r.active),
            "created_at": r.created_at,
            "updated_at": r.updated_at,
        }
        for r in rows
    ]


def insert_probes(store: Store, rows: list[tuple[str, dict]], active: bool = False) -> None:
    """Add probes (id, document) in one transaction: all of them or none."""
    now = time.time()
    values = [
        {
            "id": pid,
            "name": doc["name"],
            "document": json.dumps(doc),
            "active": active,
            "created_at": now,
            "updated_at": now,
        }
        for pid, doc in rows
    ]
    with store.transaction(Topic.PROBES) as conn:
        conn.execute(insert(table), values)


def replace_probe(store: Store, probe_id: str, document: dict) -> None:
    """Overwrite a probe's document (its name may change; whether it is active does not)."""
    with store.transaction(Topic.PROBES) as conn:
        conn.execute(
            update(table)
            .where(table.c.id == probe_id)
            .values(name=document["name"], document=json.dumps(document), updated_at=time.time())
        )


def set_probe_active(store: Store, probe_id: str, active: bool) -> None:
    """Make a probe active (it watches every generation request) or not."""
    with store.transaction(Topic.PROBES) as conn:
        conn.execute(
            update(table)
            .where(table.c.id == probe_id)
            .values(active=active, updated_at=time.time())
        )


def delete_probe(store: Store, probe_id: str) -> None:
    """Remove a probe."""
    with store.transaction(Topic.PROBES) as conn:
        conn.execute(delete(table).where(table.c.id == probe_id))
