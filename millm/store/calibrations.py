"""Stored calibrations: one row per (SAE, served model name), its summary and figures as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import delete, select

from millm.store.changes import Topic
from millm.store.database import Store, upsert
from millm.store.schema import calibrations_table


@dataclass(frozen=True)
class CalibrationRow:
    """A stored calibration, its JSON parsed."""

    sae_id: str
    model: str
    summary: dict
    figures: dict
    created_at: float


def put_calibration(store: Store, row: CalibrationRow) -> None:
    """Store a calibration, replacing the one of the same SAE and model in the same transaction."""
    table = calibrations_table
    with store.transaction(Topic.CALIBRATIONS) as conn:
        values = {
            "sae_id": row.sae_id,
            "model": row.model,
            "summary": json.dumps(row.summary),
            "figures": json.dumps(row.figures, separators=(",", ":")),
            "created_at": row.created_at,
        }
        upsert(conn, table, values)


def get_calibration(store: Store, sae_id: str, model: str) -> CalibrationRow | None:
    """The calibration of `sae_id` on `model`, if one is stored."""
    table = calibrations_table
    with store.engine.connect() as conn:
        row = conn.execute(
            select(table).where((table.c.sae_id == sae_id) & (table.c.model == model))
        ).first()
    return None if row is None else _parsed(row)


def all_calibrations(store: Store) -> list[CalibrationRow]:
    """Every stored calibration, oldest first."""
    table = calibrations_table
    with store.engine.connect() as conn:
        rows = conn.execute(select(table).order_by(table.c.created_at)).all()
    return [_parsed(row) for row in rows]


def delete_calibration(store: Store, sae_id: str, model: str) -> bool:
    """Forget a calibration; returns whether one was stored."""
    table = calibrations_table
    with store.transaction(Topic.CALIBRATIONS) as conn:
        result = conn.execute(
            delete(table).where((table.c.sae_id == sae_id) & (table.c.model == model))
        )
    return bool(result.rowcount)


def _parsed(row) -> CalibrationRow:
    return CalibrationRow(
        row.sae_id, row.model, json.loads(row.summary), json.loads(row.figures), row.created_at
    )
