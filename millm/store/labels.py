"""Feature labels in the store: one row per (SAE, feature), replaced or merged in one transaction.

Rows are keyed by the SAE's id, a hash of its weights file, so they outlive the registration: a
user's imported labels are data, and registering the same file again finds them. Plain SQLAlchemy
core, so the same code runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Connection

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import feature_labels_table, settings_table
from millm.store.settings import get_setting, set_setting

table = feature_labels_table
CHUNK = (
    500  # features per IN (...) list: well under SQLite's and PostgreSQL's bound-parameter limits
)


@dataclass(frozen=True)
class LabelRow:
    """A stored label: the feature, its label, where it came from and what the source said beside
    it."""

    feature: int
    label: str
    source: str
    detail: dict[str, Any]
    updated_at: float


def _seed_key(sae_id: str) -> str:
    return f"labels_seeded:{sae_id}"


def label_rows(store: Store, sae_id: str) -> list[LabelRow]:
    """Every stored label of an SAE, by feature."""
    query = select(table).where(table.c.sae_id == sae_id).order_by(table.c.feature)
    with store.engine.connect() as conn:
        return [
            LabelRow(r.feature, r.label, r.source, json.loads(r.detail), r.updated_at)
            for r in conn.execute(query)
        ]


def label_count(store: Store, sae_id: str) -> int:
    """How many features of an SAE have a stored label."""
    with store.engine.connect() as conn:
        return _count(conn, sae_id)


def _count(conn: Connection, sae_id: str) -> int:
    return int(
        conn.execute(
            select(func.count()).select_from(table).where(table.c.sae_id == sae_id)
        ).scalar_one()
    )


def _insert(conn: Connection, sae_id: str, rows: list[tuple[int, str, str, dict]]) -> None:
    if not rows:
        return
    now = time.time()
    values = [
        {
            "sae_id": sae_id,
            "feature": feature,
            "label": label,
            "source": source,
            "detail": json.dumps(detail),
            "updated_at": now,
        }
        for feature, label, source, detail in rows
    ]
    conn.execute(insert(table), values)


def replace_labels(
    store: Store, sae_id: str, rows: list[tuple[int, str, str, dict]]
) -> tuple[int, int]:
    """Replace every label of an SAE by `rows` (feature, label, source, detail); (labels before,
    labels now)."""
    with store.transaction(Topic.LABELS) as conn:
        before = _count(conn, sae_id)
        conn.execute(delete(table).where(table.c.sae_id == sae_id))
        _insert(conn, sae_id, rows)
        return before, _count(conn, sae_id)


def merge_labels(
    store: Store, sae_id: str, rows: list[tuple[int, str, str, dict]]
) -> tuple[int, int]:
    """Set the labels of `rows`' features, keeping the others; (labels overwritten, labels now)."""
    features = [row[0] for row in rows]
    overwritten = 0
    with store.transaction(Topic.LABELS) as conn:
        for start in range(0, len(features), CHUNK):
            where = (table.c.sae_id == sae_id) & table.c.feature.in_(
                features[start : start + CHUNK]
            )
            overwritten += conn.execute(delete(table).where(where)).rowcount or 0
        _insert(conn, sae_id, rows)
        return overwritten, _count(conn, sae_id)


def fill_labels(
    store: Store, sae_id: str, rows: list[tuple[int, str, str, dict]]
) -> tuple[int, int]:
    """Store `rows` for the features that have no label, in one transaction (a label stored
    meanwhile is never overwritten); (labels added, labels now)."""
    features = [row[0] for row in rows]
    with store.transaction(Topic.LABELS) as conn:
        had: set[int] = set()
        for start in range(0, len(features), CHUNK):
            where = (table.c.sae_id == sae_id) & table.c.feature.in_(
                features[start : start + CHUNK]
            )
            had.update(conn.execute(select(table.c.feature).where(where)).scalars())
        added = [row for row in rows if row[0] not in had]
        _insert(conn, sae_id, added)
        return len(added), _count(conn, sae_id)


def clear_labels(store: Store, sae_id: str) -> int:
    """Remove every label of an SAE; how many there were."""
    with store.transaction(Topic.LABELS) as conn:
        return conn.execute(delete(table).where(table.c.sae_id == sae_id)).rowcount or 0


def seed_labels(store: Store, sae_id: str, rows: list[tuple[int, str, str, dict]]) -> bool:
    """Store `rows` as the SAE's labels only the first time it is seeded and while it has none;
    whether they were stored. The mark stays, so labels a user cleared are not brought back."""
    key = _seed_key(sae_id)
    with store.transaction(Topic.LABELS) as conn:
        if (
            conn.execute(select(settings_table.c.key).where(settings_table.c.key == key)).first()
            is not None
        ):
            return False
        seeded = _count(conn, sae_id) == 0 and bool(rows)
        if seeded:
            _insert(conn, sae_id, rows)
        set_setting(store, key, True, conn=conn)
        return seeded


def labels_seeded(store: Store, sae_id: str) -> bool:
    """Whether the SAE's own labels were offered to the store already."""
    return bool(get_setting(store, _seed_key(sae_id), False))
