"""The sensing tables: each cluster's or circuit's sensing switch and settings, and the events
recorded, kept per base within a count and an age (the oldest dropped first, when events are
added and when they are read)."""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, func, insert, select, update

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import sensing_events_table, sensing_table


def sensing_settings(store: Store) -> dict[tuple[str, str], tuple[bool, dict]]:
    """(kind, base id) -> (enabled, config) for every base ever switched."""
    with store.reading() as conn:
        rows = conn.execute(select(sensing_table)).all()
    return {(r.kind, r.base_id): (bool(r.enabled), json.loads(r.config)) for r in rows}


def put_sensing(store: Store, kind: str, base_id: str, enabled: bool, config: dict) -> None:
    """Store a base's switch and settings."""
    values = {"enabled": enabled, "config": json.dumps(config)}
    table = sensing_table
    with store.transaction(Topic.SENSING) as conn:
        changed = conn.execute(
            update(table).where(table.c.kind == kind, table.c.base_id == base_id).values(**values)
        ).rowcount
        if not changed:
            conn.execute(insert(table).values(kind=kind, base_id=base_id, **values))


def add_events(store: Store, kind: str, events: list[dict], keep: int, max_age_s: float) -> None:
    """Record events (each with `id`, `base_id`, `created_at`) and prune their bases."""
    if not events:
        return
    table = sensing_events_table
    with store.transaction() as conn:
        conn.execute(
            insert(table),
            [
                {
                    "id": e["id"],
                    "kind": kind,
                    "base_id": e["base_id"],
                    "created_at": e["created_at"],
                    "record": json.dumps(e),
                }
                for e in events
            ],
        )
        for base_id in {e["base_id"] for e in events}:
            _prune(conn, kind, base_id, keep, max_age_s)


def _prune(conn, kind: str, base_id: str, keep: int, max_age_s: float) -> None:
    table = sensing_events_table
    mine = (table.c.kind == kind) & (table.c.base_id == base_id)
    conn.execute(delete(table).where(mine, table.c.created_at < time.time() - max_age_s))
    newest = select(table.c.id).where(mine).order_by(table.c.created_at.desc()).limit(keep)
    conn.execute(delete(table).where(mine, table.c.id.not_in(newest.scalar_subquery())))


def prune_events(store: Store, kind: str, max_age_s: float) -> None:
    """Drop a kind's events past the age (as it is read)."""
    table = sensing_events_table
    with store.transaction() as conn:
        conn.execute(
            delete(table).where(table.c.kind == kind, table.c.created_at < time.time() - max_age_s)
        )


def list_events(
    store: Store,
    kind: str,
    base_id: str | None,
    limit: int,
    since: float | None,
    edge_key: str | None = None,
) -> tuple[list[dict], int]:
    """A kind's events (of one base), newest first, up to `limit`, after `since`; and how many
    match in all."""
    table = sensing_events_table
    where = [table.c.kind == kind]
    if base_id is not None:
        where.append(table.c.base_id == base_id)
    if since is not None:
        where.append(table.c.created_at > since)
    with store.reading() as conn:
        rows = conn.execute(
            select(table.c.record).where(*where).order_by(table.c.created_at.desc())
        ).all()
    records = [json.loads(r.record) for r in rows]
    if edge_key is not None:
        records = [r for r in records if r.get("edge_key") == edge_key]
    return records[:limit], len(records)


def count_events(store: Store, kind: str, base_id: str) -> int:
    """How many events a base keeps."""
    table = sensing_events_table
    with store.reading() as conn:
        return conn.execute(
            select(func.count()).where(table.c.kind == kind, table.c.base_id == base_id)
        ).scalar_one()


def one_event(store: Store, kind: str, event_id: str) -> dict | None:
    """One event by id (None: there is none)."""
    table = sensing_events_table
    with store.reading() as conn:
        row = conn.execute(
            select(table.c.record).where(table.c.kind == kind, table.c.id == event_id)
        ).first()
    return json.loads(row.record) if row is not None else None


def delete_events(store: Store, kind: str, base_id: str | None) -> int:
    """Forget a kind's events (of one base); how many went."""
    table = sensing_events_table
    where = [table.c.kind == kind] + ([table.c.base_id == base_id] if base_id else [])
    with store.transaction() as conn:
        return conn.execute(delete(table).where(*where)).rowcount


def forget_base(conn, base_id: str) -> None:
    """A deleted cluster's or circuit's switch and events (in its deletion's transaction)."""
    conn.execute(delete(sensing_table).where(sensing_table.c.base_id == base_id))
    conn.execute(delete(sensing_events_table).where(sensing_events_table.c.base_id == base_id))
