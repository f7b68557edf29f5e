"""Stored Responses API answers: one row per response, its object and its conversation as JSON.

Rows live in the store (SQLite under the data directory, or the shared PostgreSQL), so a
response made on one replica can be read, continued or deleted on another. Nothing is cached
in memory, so no change notice is needed. The retention bound is applied on every write: rows
older than the retention go, then the oldest past the count.
"""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, func, insert, select

from millm.store.database import Store
from millm.store.schema import responses_table

table = responses_table


def save_response(
    store: Store, response: dict, items: list[dict], keep: int, retention_s: float
) -> None:
    """Store a response and the conversation it answered, then trim to the retention bound."""
    now = time.time()
    with store.transaction() as conn:
        conn.execute(
            insert(table).values(
                id=response["id"],
                created_at=now,
                response=json.dumps(response),
                items=json.dumps(items),
            )
        )
        conn.execute(delete(table).where(table.c.created_at < now - retention_s))
        count = conn.execute(select(func.count()).select_from(table)).scalar_one()
        if count > keep:
            oldest = (
                select(table.c.id)
                .order_by(table.c.created_at, table.c.id)
                .limit(count - keep)
                .scalar_subquery()
            )
            conn.execute(delete(table).where(table.c.id.in_(oldest)))


def load_response(
    store: Store, response_id: str, retention_s: float
) -> tuple[dict, list[dict]] | None:
    """A stored response and its conversation, or None (never stored, deleted, or past the
    retention)."""
    with store.reading() as conn:
        row = conn.execute(
            select(table).where(
                table.c.id == response_id, table.c.created_at >= time.time() - retention_s
            )
        ).first()
    if row is None:
        return None
    return json.loads(row.response), json.loads(row.items)


def delete_response(store: Store, response_id: str) -> bool:
    """Forget a response; whether there was one."""
    with store.transaction() as conn:
        return conn.execute(delete(table).where(table.c.id == response_id)).rowcount > 0
