"""Batches: the batch object (JSON) with the columns queries need, and each line's recorded
result. A chunk's results and the batch's counts commit in one transaction, so a crash leaves
the chunk's lines unrecorded, to run again, never half counted.

Replicas sharing a database drain one batch together: each claims a chunk of its pending lines
(row locks that skip lines another replica is claiming, then a claim held until a time it
renews), and records a line only while the line is still its own, so a replica that dies
mid-chunk leaves its lines to the others once their claim lapses and no line is recorded twice.
What happens to the batch as a whole (validating it, writing its files) is done by one replica,
the batch's claimant (`runner`, `beat`), whose claim lapses as a line's does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sqlalchemy import and_, delete, func, insert, or_, select, update

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import batch_pending_table as pending
from millm.store.schema import batch_results_table as results
from millm.store.schema import batches_table as batches

LIVE = ("validating", "in_progress", "finalizing", "cancelling")


def _batch(row) -> dict:
    return json.loads(row.batch)


def insert_batch(store: Store, batch: dict) -> None:
    """Store a new batch (every replica's runner is told)."""
    with store.transaction(Topic.BATCHES) as conn:
        conn.execute(
            insert(batches).values(
                id=batch["id"],
                status=batch["status"],
                created_at=batch["created_at"],
                input_file_id=batch["input_file_id"],
                batch=json.dumps(batch),
            )
        )


def _write(conn, batch: dict) -> None:
    conn.execute(
        update(batches)
        .where(batches.c.id == batch["id"])
        .values(status=batch["status"], batch=json.dumps(batch))
    )


def _locked(conn, batch_id: str) -> dict | None:
    """The stored batch, its row locked until the transaction ends (no other writer lands in
    between: a cancel, another replica's counts)."""
    stored = conn.execute(
        select(batches.c.batch).where(batches.c.id == batch_id).with_for_update()
    ).scalar()
    return json.loads(stored) if stored is not None else None


def update_batch(store: Store, batch_id: str, change: Callable[[dict], dict]) -> dict | None:
    """Apply `change` to the stored batch and write it back, in one transaction; the batch as
    written (None: no such batch). Every replica's runner is told (a cancel, a batch to end)."""
    with store.transaction(Topic.BATCHES) as conn:
        batch = _locked(conn, batch_id)
        if batch is None:
            return None
        batch = change(batch)
        _write(conn, batch)
    return batch


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


def claim(store: Store, batch_id: str, runner: str, hold_s: float) -> bool:
    """Whether this replica (`runner`) is the batch's claimant now: the claim is taken or renewed
    unless another replica said it holds it within the last `hold_s` seconds."""
    now = time.time()
    with store.transaction() as conn:
        taken = conn.execute(
            update(batches)
            .where(
                batches.c.id == batch_id,
                or_(
                    batches.c.runner.is_(None),
                    batches.c.runner == runner,
                    batches.c.beat < now - hold_s,
                ),
            )
            .values(runner=runner, beat=now)
        )
    return taken.rowcount == 1


def _insert_results(conn, batch_id: str, lines: list[tuple[int, bool, dict]]) -> None:
    if lines:
        conn.execute(
            insert(results),
            [
                {"batch_id": batch_id, "line": n, "ok": ok, "record": json.dumps(record)}
                for n, ok, record in lines
            ],
        )


def validated(
    store: Store,
    batch_id: str,
    refused: list[tuple[int, dict]],
    queued: list[int],
    change: Callable[[dict], dict],
) -> dict | None:
    """A validation's outcome in one transaction: the refused lines' error lines, the lines to
    run queued, the batch changed by `change` (results of a validation cut short are replaced);
    every replica's runner is told."""
    with store.transaction(Topic.BATCHES) as conn:
        batch = _locked(conn, batch_id)
        if batch is None:
            return None
        conn.execute(delete(results).where(results.c.batch_id == batch_id))
        conn.execute(delete(pending).where(pending.c.batch_id == batch_id))
        _insert_results(conn, batch_id, [(n, False, record) for n, record in refused])
        _queue(conn, batch_id, queued)
        batch = change(batch)
        _write(conn, batch)
    return batch


def _queue(conn, batch_id: str, lines: list[int]) -> None:
    if lines:
        conn.execute(insert(pending), [{"batch_id": batch_id, "line": n} for n in lines])


def queue_unrecorded(store: Store, batch_id: str, lines: list[int]) -> None:
    """Queue the lines of `lines` with no result yet (a batch validated before lines were queued
    resumes through the queue), once: the batch says it is queued."""
    with store.transaction(Topic.BATCHES) as conn:
        batch = _locked(conn, batch_id)
        if batch is None or batch["millm"].get("queued"):
            return
        done = set(
            conn.execute(select(results.c.line).where(results.c.batch_id == batch_id)).scalars()
        )
        conn.execute(delete(pending).where(pending.c.batch_id == batch_id))
        _queue(conn, batch_id, [n for n in lines if n not in done])
        _write(conn, {**batch, "millm": {**batch["millm"], "queued": True}})


def claim_lines(store: Store, batch_id: str, runner: str, most: int, hold_s: float) -> list[int]:
    """Up to `most` of the batch's first pending lines nobody holds, now held by `runner` until
    `hold_s` from now (lines another replica is claiming at this moment are skipped, not
    waited for)."""
    now = time.time()
    free = or_(pending.c.runner.is_(None), pending.c.until < now)
    query = (
        select(pending.c.line)
        .where(pending.c.batch_id == batch_id, free)
        .order_by(pending.c.line)
        .limit(most)
        .with_for_update(skip_locked=True)
    )
    with store.transaction() as conn:
        lines = list(conn.execute(query).scalars())
        if not lines:
            return []
        # Still free as it is written: SQLite reads without a lock, so two writers may have
        # picked the same lines; the second one's update finds them taken.
        until = now + hold_s
        conn.execute(
            update(pending)
            .where(pending.c.batch_id == batch_id, pending.c.line.in_(lines), free)
            .values(runner=runner, until=until)
        )
        mine = select(pending.c.line).where(
            _held_by(runner, batch_id, lines), pending.c.until == until
        )
        return sorted(conn.execute(mine).scalars())


def _held_by(runner: str, batch_id: str, lines: list[int]):
    return and_(
        pending.c.batch_id == batch_id, pending.c.runner == runner, pending.c.line.in_(lines)
    )


def hold_lines(store: Store, batch_id: str, runner: str, lines: list[int], hold_s: float) -> None:
    """Keep holding lines still running (a long chunk's claim would lapse otherwise)."""
    with store.transaction() as conn:
        conn.execute(
            update(pending)
            .where(_held_by(runner, batch_id, lines))
            .values(until=time.time() + hold_s)
        )


def release_lines(store: Store, batch_id: str, runner: str, lines: list[int]) -> None:
    """Let go of lines that did not run (anyone may claim them again)."""
    if lines:
        with store.transaction() as conn:
            conn.execute(
                update(pending)
                .where(_held_by(runner, batch_id, lines))
                .values(runner=None, until=None)
            )


def record_lines(
    store: Store, batch_id: str, runner: str, lines: list[tuple[int, bool, dict]]
) -> list[int]:
    """Record the results of lines `runner` still holds, and add them to the batch's counts, in
    one transaction; the lines recorded (one whose claim lapsed and was taken, or whose batch
    ended meanwhile, is not)."""
    numbers = [n for n, _, _ in lines]
    with store.transaction() as conn:
        held = set(
            conn.execute(
                select(pending.c.line).where(_held_by(runner, batch_id, numbers)).with_for_update()
            ).scalars()
        )
        kept = [line for line in lines if line[0] in held]
        if not kept:
            return []
        batch = _locked(conn, batch_id)
        assert batch is not None  # its pending lines reference it
        conn.execute(delete(pending).where(_held_by(runner, batch_id, sorted(held))))
        _insert_results(conn, batch_id, kept)
        counts = dict(batch["request_counts"])
        counts["completed"] += sum(1 for _, ok, _ in kept if ok)
        counts["failed"] += sum(1 for _, ok, _ in kept if not ok)
        _write(conn, {**batch, "request_counts": counts})
    return [n for n, _, _ in kept]


def queue_state(store: Store, batch_id: str, runner: str) -> tuple[int, int]:
    """The batch's pending lines, and how many of them another replica holds now."""
    now = time.time()
    elsewhere = and_(pending.c.runner != runner, pending.c.until >= now)
    query = select(func.count(), func.count().filter(elsewhere)).where(
        pending.c.batch_id == batch_id
    )
    with store.reading() as conn:
        total, held = conn.execute(query).one()
    return int(total), int(held)


def drop_pending(store: Store, batch_id: str) -> None:
    """Nothing more of the batch runs: its pending lines are dropped (a replica finishing a
    chunk of them records none)."""
    with store.transaction() as conn:
        conn.execute(delete(pending).where(pending.c.batch_id == batch_id))


def recorded(store: Store, batch_id: str) -> dict[int, tuple[bool, dict]]:
    """Each recorded line's result: (ok, its file line)."""
    query = select(results).where(results.c.batch_id == batch_id)
    with store.reading() as conn:
        return {r.line: (r.ok, json.loads(r.record)) for r in conn.execute(query).all()}


def finish(store: Store, batch: dict) -> None:
    """A batch that ended: its object written, its recorded results and pending lines dropped
    (its files hold them), its claim let go."""
    with store.transaction() as conn:
        conn.execute(delete(pending).where(pending.c.batch_id == batch["id"]))
        conn.execute(delete(results).where(results.c.batch_id == batch["id"]))
        conn.execute(
            update(batches)
            .where(batches.c.id == batch["id"])
            .values(status=batch["status"], batch=json.dumps(batch), runner=None, beat=None)
        )
