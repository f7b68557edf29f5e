"""Batches: the batch object (JSON) with the columns queries need, and each line's recorded
result. A chunk's results and the batch's counts commit in one transaction, so a crash leaves
the chunk's lines unrecorded, to run again, never half counted.

One replica drains a batch at a time: it claims the batch (`runner`, `beat`) and says so again
while it works; a claim older than STALE_S is anyone's, so a replica that died leaves its
batches to the others.
"""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, insert, or_, select, update

from millm.store.database import Store
from millm.store.schema import batch_results_table as results
from millm.store.schema import batches_table as batches

LIVE = ("validating", "in_progress", "finalizing", "cancelling")
STALE_S = 60.0


def _batch(row) -> dict:
    return json.loads(row.batch)


def insert_batch(store: Store, batch: dict) -> None:
    """Store a new batch."""
    with store.transaction() as conn:
        conn.execute(
            insert(batches).values(
                id=batch["id"],
                status=batch["status"],
                created_at=batch["created_at"],
                input_file_id=batch["input_file_id"],
                batch=json.dumps(batch),
            )
        )


def _keeping_cancel(conn, batch: dict) -> dict:
    """`batch` to write, keeping a cancel another writer stored since it was read (the row is
    locked for the rest of the transaction, so none can land in between)."""
    stored = conn.execute(
        select(batches.c.batch).where(batches.c.id == batch["id"]).with_for_update()
    ).scalar()
    now = json.loads(stored) if stored is not None else {}
    if now.get("status") == "cancelling" and batch["status"] in ("validating", "in_progress"):
        return {**batch, "status": "cancelling", "cancelling_at": now.get("cancelling_at")}
    return batch


def save_batch(store: Store, batch: dict) -> None:
    """Write a batch's object and status back (a cancel stored meanwhile is kept)."""
    with store.transaction() as conn:
        batch = _keeping_cancel(conn, batch)
        conn.execute(
            update(batches)
            .where(batches.c.id == batch["id"])
            .values(status=batch["status"], batch=json.dumps(batch))
        )


def batch_row(store: Store, batch_id: str) -> dict | None:
    """One batch, or None."""
    with store.reading() as conn:
        row = conn.execute(select(batches).where(batches.c.id == batch_id)).first()
    return _batch(row) if row is not None else None


def batch_rows(store: Store, after: str | None, limit: int) -> list[dict]:
    """Up to `limit` batches, newest first, after the batch `after`."""
    query = select(batches).order_by(batches.c.created_at.desc(), batches.c.id.desc())
    with store.reading() as conn:
        rows = [_batch(row) for row in conn.execute(query).all()]
    if after is not None:
        ids = [row["id"] for row in rows]
        rows = rows[ids.index(after) + 1 :] if after in ids else []
    return rows[:limit]


def live_batches(store: Store) -> list[dict]:
    """Batches not yet ended, oldest first."""
    query = select(batches).where(batches.c.status.in_(LIVE)).order_by(batches.c.created_at)
    with store.reading() as conn:
        return [_batch(row) for row in conn.execute(query).all()]


def backlog(store: Store) -> int:
    """Lines of live batches not yet answered (as of each batch's last recorded chunk)."""
    rows = 0
    for batch in live_batches(store):
        counts = batch["request_counts"]
        rows += counts["total"] - counts["completed"] - counts["failed"]
    return rows


def file_in_use(store: Store, file_id: str) -> str | None:
    """The live batch reading `file_id`, if any."""
    query = select(batches.c.id).where(
        batches.c.input_file_id == file_id, batches.c.status.in_(LIVE)
    )
    with store.reading() as conn:
        return conn.execute(query).scalar()


def claim(store: Store, batch_id: str, runner: str) -> bool:
    """Whether this replica (`runner`) drains the batch now: its claim is taken or renewed
    unless another replica said it works on it within STALE_S."""
    now = time.time()
    with store.transaction() as conn:
        taken = conn.execute(
            update(batches)
            .where(
                batches.c.id == batch_id,
                or_(
                    batches.c.runner.is_(None),
                    batches.c.runner == runner,
                    batches.c.beat < now - STALE_S,
                ),
            )
            .values(runner=runner, beat=now)
        )
    return taken.rowcount == 1


def recorded(store: Store, batch_id: str) -> dict[int, tuple[bool, dict]]:
    """Each recorded line's result: (ok, its file line)."""
    query = select(results).where(results.c.batch_id == batch_id)
    with store.reading() as conn:
        return {r.line: (r.ok, json.loads(r.record)) for r in conn.execute(query).all()}


def record_chunk(store: Store, batch: dict, lines: list[tuple[int, bool, dict]]) -> None:
    """A chunk's results and the batch's counts, in one transaction (a cancel stored meanwhile
    is kept)."""
    with store.transaction() as conn:
        batch = _keeping_cancel(conn, batch)
        if lines:
            conn.execute(
                insert(results),
                [
                    {"batch_id": batch["id"], "line": n, "ok": ok, "record": json.dumps(record)}
                    for n, ok, record in lines
                ],
            )
        conn.execute(
            update(batches)
            .where(batches.c.id == batch["id"])
            .values(status=batch["status"], batch=json.dumps(batch))
        )


def finish(store: Store, batch: dict) -> None:
    """A batch that ended: its object written, its recorded results dropped (its files hold
    them), its claim let go."""
    with store.transaction() as conn:
        conn.execute(delete(results).where(results.c.batch_id == batch["id"]))
        conn.execute(
            update(batches)
            .where(batches.c.id == batch["id"])
            .values(status=batch["status"], batch=json.dumps(batch), runner=None, beat=None)
        )


def forget_results(store: Store, batch_id: str) -> None:
    """Drop a batch's recorded results (a validation run again starts clean)."""
    with store.transaction() as conn:
        conn.execute(delete(results).where(results.c.batch_id == batch_id))
