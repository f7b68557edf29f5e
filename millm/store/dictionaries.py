"""Dictionary trainings and grades: a training's row from its start to its end (a restart resumes
the `running` ones whose process is gone), and each grade's card."""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, insert, select, update

from millm.store.changes import Topic
from millm.store.database import Store, upsert
from millm.store.schema import dictionary_grades_table as grades
from millm.store.schema import dictionary_trainings_table as trainings

RUNNING = "running"


def _training(row) -> dict:
    out = dict(row._mapping)
    for key in ("request", "progress", "result", "error"):
        out[key] = json.loads(out[key]) if out[key] is not None else None
    return out


def insert_training(store: Store, training_id: str, model: str, request: dict, work_dir: str):
    """A new training, running."""
    now = time.time()
    values = {
        "id": training_id, "model": model, "request": json.dumps(request), "state": RUNNING,
        "work_dir": work_dir, "progress": json.dumps({}), "created_at": now, "heartbeat_at": now,
    }  # fmt: skip
    with store.transaction(Topic.DICTIONARIES) as conn:
        conn.execute(insert(trainings).values(values))


def delete_training(store: Store, training_id: str) -> None:
    """Forget a training that never started (its job was refused)."""
    with store.transaction(Topic.DICTIONARIES) as conn:
        conn.execute(delete(trainings).where(trainings.c.id == training_id))


def training_row(store: Store, training_id: str) -> dict | None:
    """One training, or None."""
    with store.reading() as conn:
        row = conn.execute(select(trainings).where(trainings.c.id == training_id)).first()
    return _training(row) if row is not None else None


def training_rows(store: Store) -> list[dict]:
    """Every training, newest first."""
    with store.reading() as conn:
        rows = conn.execute(select(trainings).order_by(trainings.c.created_at.desc())).all()
    return [_training(row) for row in rows]


def beat(store: Store, training_id: str, progress: dict) -> None:
    """A running training's progress, and that its process is alive."""
    values = {"progress": json.dumps(progress), "heartbeat_at": time.time()}
    with store.transaction(Topic.DICTIONARIES) as conn:
        conn.execute(update(trainings).where(trainings.c.id == training_id).values(values))


def end_training(
    store: Store,
    training_id: str,
    state: str,
    progress: dict,
    result: dict | None,
    error: dict | None,
) -> None:
    """A training's end: succeeded, failed or cancelled, with what it made or why not."""
    values = {
        "state": state, "progress": json.dumps(progress), "finished_at": time.time(),
        "result": json.dumps(result) if result is not None else None,
        "error": json.dumps(error) if error is not None else None,
    }  # fmt: skip
    with store.transaction(Topic.DICTIONARIES) as conn:
        conn.execute(update(trainings).where(trainings.c.id == training_id).values(values))


def reopen_training(store: Store, training_id: str) -> bool:
    """A failed training running again (resumed from its checkpoint); False unless it was
    failed (two resumes at once: one wins)."""
    values = {"state": RUNNING, "error": None, "finished_at": None, "heartbeat_at": time.time()}
    failed = (trainings.c.id == training_id) & (trainings.c.state == "failed")
    with store.transaction(Topic.DICTIONARIES) as conn:
        return conn.execute(update(trainings).where(failed).values(values)).rowcount == 1


def take_orphan(store: Store, training_id: str, stale_before: float) -> bool:
    """Claim a `running` training whose heartbeat stopped before `stale_before` (its process is
    gone); only one claimant wins (the update's own condition decides)."""
    stale = (
        (trainings.c.id == training_id)
        & (trainings.c.state == RUNNING)
        & (trainings.c.heartbeat_at < stale_before)
    )
    with store.transaction(Topic.DICTIONARIES) as conn:
        taken = conn.execute(update(trainings).where(stale).values(heartbeat_at=time.time()))
        return taken.rowcount == 1


def insert_grade(store: Store, card: dict) -> None:
    """Keep a grade's card (its `id`, `model`, `created_at` and the graded dictionary's id, an SAE's
    `sae_id` or a set's `transcoder_set_id`, are columns too)."""
    with store.transaction(Topic.DICTIONARIES) as conn:
        conn.execute(insert(grades).values(_grade_row(card)))


def _grade_row(card: dict) -> dict:
    values = {key: card[key] for key in ("id", "model", "created_at")}
    values["sae_id"] = card.get("sae_id") or card["transcoder_set_id"]
    return {**values, "card": json.dumps(card)}


def keep_grade(store: Store, card: dict) -> None:
    """`insert_grade` for a card that may be kept already (a shipped one, read by two at once):
    the row of its id written once, whoever writes it."""
    with store.transaction(Topic.DICTIONARIES) as conn:
        upsert(conn, grades, _grade_row(card))


def grade_cards(store: Store, sae_id: str) -> list[dict]:
    """A dictionary's grades (an SAE's or a transcoder set's, by its id), newest first."""
    query = (
        select(grades.c.card).where(grades.c.sae_id == sae_id).order_by(grades.c.created_at.desc())
    )
    with store.reading() as conn:
        return [json.loads(row.card) for row in conn.execute(query).all()]
