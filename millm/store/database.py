"""Persistence: SQLite under the data directory by default, any SQLAlchemy URL (Postgres) by
DATABASE_URL.

This module is the database handle (`Store`: the engine, the migration at start, transactions
that announce their changes to other replicas) and the SQL helpers every table module shares;
the tables are in schema.py, and each table's reads and writes in a module of its own. What
survives a restart: registered SAEs, which are attached where, the live steering values
and whether steering is enabled, profiles (with the active one), clusters and circuits,
registered models (with the steering lock), probes (with which are active) and steering
vectors. The schema is versioned by Alembic (one revision per version, in migrations/):
`Store.migrate` brings any older database, from schema 1 on, to the newest in place at start,
and never drops a user's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Table,
    create_engine,
    delete,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from millm.errors import StoreUnavailable
from millm.store.changes import LIVENESS, Topic, announce
from millm.store.migrating import SCHEMA_VERSION, one_migration_at_a_time, upgrade_to_head
from millm.store.schema import settings_table


def database_url(home: Path, url: str | None) -> str:
    """DATABASE_URL when given, else a SQLite file in the data directory."""
    return url or f"sqlite:///{home / 'millm.db'}"


class Store:
    """The database: its engine, its migration, and transactions (the table modules take it
    first)."""

    def __init__(self, url: str):
        self.url = url
        # On PostgreSQL the pool's connections get the listener's limits: a write never hangs on a
        # dead peer.
        connect_args = LIVENESS if make_url(url).get_backend_name() == "postgresql" else {}
        self.engine: Engine = create_engine(
            url, future=True, pool_pre_ping=True, connect_args=connect_args
        )
        self.migrate()

    def migrate(self) -> None:
        """Bring the schema to the newest revision through Alembic, in one transaction; existing
        rows are kept."""
        # Only reaching the database is store_unavailable: a migration that fails says why itself,
        # where unavailable_as_503 would call SQLite's "table already exists" a connection problem.
        with unavailable_as_503():
            conn = self.engine.connect()
        with conn, conn.begin(), one_migration_at_a_time(conn):
            upgrade_to_head(conn)
            # Kept for older code and tools that read the version from the settings.
            if conn.execute(
                select(settings_table.c.value).where(settings_table.c.key == "schema_version")
            ).scalar() != str(SCHEMA_VERSION):
                upsert(
                    conn, settings_table, {"key": "schema_version", "value": str(SCHEMA_VERSION)}
                )

    @cached_property
    def origin(self) -> str:
        """This process's name in change notices, so it can tell its own writes from other
        replicas'."""
        return uuid.uuid4().hex[:12]

    @property
    def shared(self) -> bool:
        """Whether other processes may share this database (PostgreSQL), so changes are announced
        and listened for."""
        return self.engine.dialect.name == "postgresql"

    @contextmanager
    def transaction(self, *topics: Topic) -> Iterator[Connection]:
        """One atomic unit: everything inside commits together or not at all; other replicas
        are told about `topics` when it commits (store/changes.py)."""
        with unavailable_as_503(), self.engine.begin() as conn:
            yield conn
            for topic in topics:
                announce(conn, topic, self.origin)

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection for reads (503 store_unavailable when the database cannot be reached)."""
        with unavailable_as_503(), self.engine.connect() as conn:
            yield conn

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()


@contextmanager
def unavailable_as_503() -> Iterator[None]:
    """A database that cannot be reached (connection refused or lost, SQLite locked) is 503
    store_unavailable, never a bare 500: the client may retry, nothing was half written."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable(
            f"the database cannot be reached ({_first_line(exc)}); nothing was changed; retry"
        ) from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailable(
                f"the database connection was lost ({_first_line(exc)}); nothing was changed; retry"
            ) from exc
        raise


def _first_line(exc: DBAPIError) -> str:
    lines = str(exc.orig).strip().splitlines() if exc.orig is not None else []
    return lines[0] if lines else type(exc).__name__


def upsert(conn: Connection, table: Table, values: dict[str, Any]) -> None:
    """Insert a row, or overwrite the one with its primary key. One statement, not
    delete-then-insert: two replicas writing one key at once would both insert, and one would
    fail."""
    keys = list(table.primary_key.columns)
    changes = {name: value for name, value in values.items() if name not in {c.name for c in keys}}
    if conn.dialect.name == "postgresql":
        conn.execute(
            postgresql_insert(table)
            .values(**values)
            .on_conflict_do_update(index_elements=keys, set_=changes)
        )
    elif conn.dialect.name == "sqlite":
        conn.execute(
            sqlite_insert(table)
            .values(**values)
            .on_conflict_do_update(index_elements=keys, set_=changes)
        )
    else:  # another database serves one process: delete-then-insert cannot race there
        conn.execute(delete(table).where(*(c == values[c.name] for c in keys)))
        conn.execute(insert(table).values(**values))
