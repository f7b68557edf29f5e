"""The registered models' table: the names clients send as `model`, and what each refers to."""

from __future__ import annotations

import json

from sqlalchemy import delete, select

from millm.store.changes import Topic
from millm.store.database import Store, upsert
from millm.store.schema import models_table


def model_rows(store: Store) -> list[dict]:
    """Every registered model: {name, reference, info, registered_at}, oldest first."""
    with store.reading() as conn:
        rows = conn.execute(select(models_table).order_by(models_table.c.registered_at)).all()
    return [
        {
            "name": r.name,
            "reference": r.reference,
            "info": json.loads(r.info),
            "registered_at": r.registered_at,
        }
        for r in rows
    ]


def put_model(store: Store, name: str, reference: str, info: dict, registered_at: float) -> None:
    """Register a model, or replace the registration of that name, in one transaction."""
    with store.transaction(Topic.MODELS) as conn:
        upsert(
            conn,
            models_table,
            {
                "name": name,
                "reference": reference,
                "info": json.dumps(info),
                "registered_at": registered_at,
            },
        )


def remove_model(store: Store, name: str) -> None:
    """Forget a registered model."""
    with store.transaction(Topic.MODELS) as conn:
        conn.execute(delete(models_table).where(models_table.c.name == name))
