"""The variants' table: steered variants, each a name, its base model and its steering document."""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from millm.errors import Conflict
from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import variants_table

table = variants_table


def _row(row) -> dict:
    return {
        "id": row.id,
        "name": row.name,
        "base": row.base,
        "document": json.loads(row.document),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


def variant_rows(store: Store, ids: list[str] | None = None) -> list[dict]:
    """Every variant row (or those of `ids`): {id, name, base, document, created_at, updated_at},
    by name."""
    query = select(table).order_by(table.c.name)
    if ids is not None:
        query = query.where(table.c.id.in_(ids))
    with store.reading() as conn:
        rows = conn.execute(query).all()
    return [_row(row) for row in rows]


def _taken(exc: IntegrityError) -> Conflict:
    return Conflict(
        "a variant with this name was created meanwhile (by another replica); choose another name",
        param="name",
        code="variant_exists",
    )


def insert_variant(store: Store, variant_id: str, name: str, base: str, document: dict) -> None:
    """Store a new variant."""
    now = time.time()
    values = {
        "id": variant_id,
        "name": name,
        "base": base,
        "document": json.dumps(document),
        "created_at": now,
        "updated_at": now,
    }
    try:
        with store.transaction(Topic.VARIANTS) as conn:
            conn.execute(insert(table).values(values))
    except IntegrityError as exc:
        raise _taken(exc) from exc


def update_variant(store: Store, variant_id: str, name: str, base: str, document: dict) -> None:
    """Replace a variant's name, base and document."""
    values = {
        "name": name,
        "base": base,
        "document": json.dumps(document),
        "updated_at": time.time(),
    }
    try:
        with store.transaction(Topic.VARIANTS) as conn:
            conn.execute(update(table).where(table.c.id == variant_id).values(values))
    except IntegrityError as exc:
        raise _taken(exc) from exc


def delete_variant(store: Store, variant_id: str) -> None:
    """Forget a variant."""
    with store.transaction(Topic.VARIANTS) as conn:
        conn.execute(delete(table).where(table.c.id == variant_id))
