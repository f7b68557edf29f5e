"""Explanations of SAE features written by a model: one row per (SAE, feature, explainer).

Kept apart from the labels' table, so writing an explanation never touches a label a file or a
user brought; each explanation is written in its own transaction as soon as it is scored, so a
job that fails later keeps every one written before.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select

from millm.store.changes import Topic
from millm.store.database import Store, upsert
from millm.store.schema import explanations_table

table = explanations_table


@dataclass(frozen=True)
class ExplanationRow:
    """A stored explanation: the feature, who wrote it, what it says, its scores and provenance."""

    feature: int
    explainer: str
    explanation: str
    detail: dict[str, Any]
    created_at: float


def put_explanation(
    store: Store, sae_id: str, feature: int, explainer: str, explanation: str, detail: dict
) -> None:
    """Store one explanation, replacing the same explainer's earlier one of that feature."""
    values = {
        "sae_id": sae_id,
        "feature": feature,
        "explainer": explainer,
        "explanation": explanation,
        "detail": json.dumps(detail),
        "created_at": time.time(),
    }
    with store.transaction(Topic.LABELS) as conn:
        upsert(conn, table, values)


def explanation_rows(store: Store, sae_id: str) -> list[ExplanationRow]:
    """Every stored explanation of an SAE, by feature then explainer."""
    query = (
        select(table).where(table.c.sae_id == sae_id).order_by(table.c.feature, table.c.explainer)
    )
    with store.engine.connect() as conn:
        return [
            ExplanationRow(
                r.feature, r.explainer, r.explanation, json.loads(r.detail), r.created_at
            )
            for r in conn.execute(query)
        ]


def clear_explanations(store: Store, sae_id: str) -> int:
    """Remove every explanation of an SAE; how many there were."""
    with store.transaction(Topic.LABELS) as conn:
        return conn.execute(delete(table).where(table.c.sae_id == sae_id)).rowcount or 0
