"""The evaluations' table: each steering evaluation's result, as JSON."""

from __future__ import annotations

import json

from sqlalchemy import delete, func, insert, select

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import evaluations_table

table = evaluations_table


def evaluation_results(store: Store) -> list[dict]:
    """Every stored result, newest first."""
    query = select(table.c.result).order_by(table.c.created_at.desc())
    with store.reading() as conn:
        return [json.loads(row.result) for row in conn.execute(query).all()]


def evaluation_result(store: Store, evaluation_id: str) -> dict | None:
    """One stored result, None when there is none with this id."""
    with store.reading() as conn:
        row = conn.execute(select(table.c.result).where(table.c.id == evaluation_id)).first()
    return json.loads(row.result) if row is not None else None


def count_evaluations(store: Store) -> int:
    """How many are stored."""
    with store.reading() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def insert_evaluation(store: Store, result: dict) -> None:
    """Store a result (its `id`, `created_at` and `concept` are columns too)."""
    values = {
        "id": result["id"],
        "created_at": result["created_at"],
        "concept": result["concept"][:400],
        "result": json.dumps(result),
    }
    with store.transaction(Topic.EVALUATIONS) as conn:
        conn.execute(insert(table).values(values))


def delete_evaluation(store: Store, evaluation_id: str) -> bool:
    """Forget a result; whether there was one."""
    with store.transaction(Topic.EVALUATIONS) as conn:
        return conn.execute(delete(table).where(table.c.id == evaluation_id)).rowcount > 0
