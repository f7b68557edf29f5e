"""Schema migrations through Alembic: one revision per schema version (migrations/versions/),
applied at start in one transaction, one process at a time.

A database made before Alembic (schema 1-5: millm's tables, a `schema_version` setting, no
`alembic_version` table) is first stamped at its version, then upgraded like any other; one
whose first start stopped before writing that setting is recognised by its tables.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

# The newest schema version; Alembic's head revision is its number in four digits ("0009").
SCHEMA_VERSION = 17
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# Any constant works, as long as every replica takes the same one: the ASCII of "millm".
MIGRATION_LOCK = 0x6D696C6C6D
# Alembic's `op` and `context` are module globals: two migrations at once in one process (two
# Stores opened by two threads) would run each other's steps on the wrong connection.
_migrating = threading.Lock()

# The tables each schema version added, as the scheme before Alembic made them: how a database it
# made is recognised, and which version one is whose schema_version row was never written (its
# first start stopped between creating the tables and writing the row).
LEGACY_TABLES: dict[int, set[str]] = {
    1: {"millm_settings", "millm_saes", "millm_attachments", "millm_strengths", "millm_profiles"},
    2: {"millm_clusters", "millm_circuits"},
    3: {"millm_models"},
    4: {"millm_feature_labels", "millm_calibrations"},
    5: {"millm_vectors", "millm_probes"},
}


def revision_of(version: int) -> str:
    """The Alembic revision id of a schema version."""
    return f"{version:04d}"


def alembic_config(conn: Connection) -> Config:
    """Alembic's configuration, built in code (no alembic.ini), running on `conn`."""
    config = Config()
    # ConfigParser reads % as interpolation, and the install path may hold one.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["connection"] = conn
    return config


def hold_migration_lock(conn: Connection) -> None:
    """Make starts that race on one database migrate one after another, until this transaction
    ends."""
    if conn.dialect.name == "postgresql":
        # Replicas starting together on an empty database: the second waits here, then finds the
        # schema at head and has nothing to do.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    elif conn.dialect.name == "sqlite":
        # pysqlite opens no transaction before DDL, so without this each CREATE would commit alone;
        # IMMEDIATE also takes the write lock before the schema is read.
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def legacy_version(conn: Connection) -> int | None:
    """The schema version of a database the scheme before Alembic made; None for an empty
    database or one Alembic versions."""
    tables = set(inspect(conn).get_table_names())
    if "alembic_version" in tables or not tables & set().union(*LEGACY_TABLES.values()):
        return None
    stored = None
    if "millm_settings" in tables:
        stored = conn.execute(
            text("SELECT value FROM millm_settings WHERE key = 'schema_version'")
        ).scalar()
    return int(stored) if stored is not None else version_by_shape(tables)


def version_by_shape(tables: set[str]) -> int:
    """The newest version whose tables are all in `tables`."""
    version = 0
    for number, added in sorted(LEGACY_TABLES.items()):
        if not added <= tables:
            break
        version = number
    if version == 0:
        raise RuntimeError(
            f"the database has some of millm's tables ({', '.join(sorted(tables))}) but not all "
            "of any schema version's"
        )
    return version


@contextmanager
def one_migration_at_a_time(conn: Connection) -> Iterator[None]:
    """Around a migration: one per process (Alembic's globals), one per database (its lock, until
    the transaction ends)."""
    with _migrating:
        hold_migration_lock(conn)
        yield


def upgrade_to_head(conn: Connection) -> None:
    """Stamp a database made before Alembic at its version, then upgrade to the head revision."""
    config = alembic_config(conn)
    legacy = legacy_version(conn)
    if legacy is not None:
        command.stamp(config, revision_of(legacy))
    command.upgrade(config, "head")
