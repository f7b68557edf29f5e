"""The registered SAEs' table: each SAE's info, keyed by its weights' hash."""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, select

from millm.store.changes import Topic
from millm.store.database import Store, upsert
from millm.store.schema import attachments_table, saes_table, strengths_table


def sae_rows(store: Store) -> list[dict]:
    """Every registered SAE's info, oldest first."""
    with store.reading() as conn:
        rows = conn.execute(select(saes_table).order_by(saes_table.c.registered_at)).all()
    return [json.loads(row.info) for row in rows]


def add_sae(store: Store, info: dict) -> None:
    """Register an SAE (again: the id is its weights' hash, so two replicas registering one file
    agree)."""
    with store.transaction(Topic.SAES) as conn:
        upsert(
            conn,
            saes_table,
            {"id": info["id"], "info": json.dumps(info), "registered_at": time.time()},
        )


def remove_sae(store: Store, sae_id: str) -> None:
    """Forget an SAE, its attachment and its live strengths (profiles keep their documents)."""
    with store.transaction(Topic.SAES, Topic.STEERING) as conn:
        conn.execute(delete(attachments_table).where(attachments_table.c.sae_id == sae_id))
        conn.execute(delete(strengths_table).where(strengths_table.c.sae_id == sae_id))
        conn.execute(delete(saes_table).where(saes_table.c.id == sae_id))
