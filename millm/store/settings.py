"""The settings table: small JSON values under a key (the steering lock, a packaged model's
set-up, the steering state's version, enabled flag and active base)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from millm.store.changes import Topic
from millm.store.database import Store, upsert
from millm.store.schema import settings_table


def read_raw(conn: Connection, key: str) -> str | None:
    """The stored text under `key`, inside an open transaction."""
    return conn.execute(select(settings_table.c.value).where(settings_table.c.key == key)).scalar()


def write_raw(conn: Connection, key: str, value: str | None) -> None:
    """Store text under `key` (None removes it), inside an open transaction."""
    if value is None:
        conn.execute(delete(settings_table).where(settings_table.c.key == key))
    else:
        upsert(conn, settings_table, {"key": key, "value": value})


def get_setting(store: Store, key: str, default: Any = None) -> Any:
    """A JSON value stored under `key`."""
    with store.reading() as conn:
        raw = read_raw(conn, key)
    return default if raw is None else json.loads(raw)


def set_setting(
    store: Store, key: str, value: Any, conn: Connection | None = None, topic: Topic | None = None
) -> None:
    """Store a JSON value under `key` (None removes it); other replicas are told about `topic`."""
    raw = None if value is None else json.dumps(value)
    if conn is not None:
        write_raw(conn, key, raw)
        return
    with store.transaction(*([topic] if topic else [])) as c:
        write_raw(c, key, raw)
