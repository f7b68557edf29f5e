"""Schema migrations through Alembic: every earlier version, with data, upgraded in place on SQLite
and PostgreSQL; a fresh database made at head; replicas starting together migrate once."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, select, text

from millm.store.database import Store
from millm.store.migrating import MIGRATION_LOCK, MIGRATIONS_DIR, SCHEMA_VERSION, revision_of
from millm.store.schema import metadata
from millm.store.settings import get_setting
from millm.store.steering import write_features
from tests.support.old_schemas import LEGACY_VERSIONS, build, old_rows, upgraded
from tests.support.postgres import PostgresServer

HEAD = revision_of(SCHEMA_VERSION)


def admin(server: PostgresServer, statement: str) -> None:
    engine = create_engine(server.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(statement)
    engine.dispose()


@pytest.fixture
def postgres_url(postgres):
    """A new, empty PostgreSQL database: one per case, so no case sees another's tables."""
    name = f"case_{uuid.uuid4().hex[:12]}"
    admin(postgres, f"CREATE DATABASE {name}")
    yield f"{postgres.url.rsplit('/', 1)[0]}/{name}"
    # Dropped, not left to the server's stop: its shutdown checkpoint would write every copy out.
    admin(postgres, f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    """An empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'millm.db'}"
    return request.getfixturevalue("postgres_url")


def snapshot(url: str) -> dict[str, list[dict]]:
    """Every row of every table of the newest schema, and alembic_version, in primary-key order."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = {name: _rows(conn, table) for name, table in metadata.tables.items()}
            rows["alembic_version"] = [
                dict(row._mapping)
                for row in conn.execute(text("SELECT version_num FROM alembic_version"))
            ]
    finally:
        engine.dispose()
    return rows


def _rows(conn, table) -> list[dict]:
    # Sorted here, not by ORDER BY: PostgreSQL's collation may order text otherwise than Python.
    keys = [column.name for column in table.primary_key.columns]
    return sorted(
        (dict(row._mapping) for row in conn.execute(select(table))),
        key=lambda row: [row[k] for k in keys],
    )


def in_order(rows: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """`rows` for every table of the newest schema (empty where none), in primary-key order."""
    ordered = {}
    for name, table in metadata.tables.items():
        keys = [column.name for column in table.primary_key.columns]
        ordered[name] = sorted(rows.get(name, []), key=lambda row: [row[k] for k in keys])
    return ordered


def schema_diff(url: str) -> list:
    """What Alembic's autogenerate finds between the database and the Table definitions (nothing,
    at head)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), metadata)
    finally:
        engine.dispose()


def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def steps(caplog) -> list[str]:
    """The migration steps Alembic ran, as 'upgrade 0004 -> 0005' (without the revision's title)."""
    return [
        r.getMessage().removeprefix("Running ").split(",")[0]
        for r in caplog.records
        if r.getMessage().startswith("Running ")
    ]


def open_store(url: str, caplog) -> list[str]:
    """Open (so migrate) and close a Store at `url`; the steps it ran."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="alembic.runtime.migration"):
        Store(url).close()
    return steps(caplog)


def test_the_revisions_are_one_line_from_0001_to_the_schema_version():
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    chain = [(rev.revision, rev.down_revision) for rev in reversed(list(script.walk_revisions()))]
    assert chain == [
        ("0001", None),
        ("0002", "0001"),
        ("0003", "0002"),
        ("0004", "0003"),
        ("0005", "0004"),
        ("0006", "0005"),
        ("0007", "0006"),
        ("0008", "0007"),
        ("0009", "0008"),
        ("0010", "0009"),
        ("0011", "0010"),
        ("0012", "0011"),
        ("0013", "0012"),
        ("0014", "0013"),
        ("0015", "0014"),
        ("0016", "0015"),
        ("0017", "0016"),
    ]
    assert script.get_heads() == [HEAD] == ["0017"]


def test_a_fresh_database_is_made_at_head(url, caplog):
    assert open_store(url, caplog) == [
        f"upgrade {'' if v == 1 else revision_of(v - 1)} -> {revision_of(v)}"
        for v in range(1, SCHEMA_VERSION + 1)
    ]
    rows = snapshot(url)
    assert rows["alembic_version"] == [{"version_num": HEAD}]
    assert rows["millm_settings"] == [
        {"key": "schema_version", "value": str(SCHEMA_VERSION)},
        {"key": "steering_version", "value": "0"},
    ]
    assert all(rows[name] == [] for name in metadata.tables if name != "millm_settings")
    assert schema_diff(url) == []
    assert open_store(url, caplog) == [] and snapshot(url) == rows


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_an_old_database_is_upgraded_in_place_keeping_every_row(url, version, caplog):
    rows = old_rows(version)
    build(url, version, rows)
    assert open_store(url, caplog) == [f"stamp_revision  -> {revision_of(version)}"] + [
        f"upgrade {revision_of(v)} -> {revision_of(v + 1)}" for v in range(version, SCHEMA_VERSION)
    ]
    after = snapshot(url)
    assert after == {
        **in_order(upgraded(version, rows)),
        "alembic_version": [{"version_num": HEAD}],
    }
    # The values the newest code reads back, spelled out once more for what schema 6 added.
    assert [
        (p["id"], p["name"], p["created_at"], p["version"]) for p in after["millm_profiles"]
    ] == [
        ("prof_1", "calm", 1764000010.25, 1),
        ("prof_2", "river-run", 1764000020.25, 1),
        ("prof_3", "ünïcode ✓", 1764000030.25, 1),
    ]
    assert after["millm_attachments"] == [{"sae_id": "sae_a", "layer": 1, "model": None}]
    ops = [(s["sae_id"], s["feature"], s["op"], s["value"]) for s in after["millm_strengths"]]
    if version == 5:
        assert ops == [
            ("sae_a", 3, "add", None),
            ("sae_a", 11, "clamp", 2.5),
            ("sae_b", 0, "ablate", None),
        ]
    else:  # every value stored before ops existed was an add
        assert ops == [
            ("sae_a", 3, "add", None),
            ("sae_a", 11, "add", None),
            ("sae_b", 0, "add", None),
        ]
    assert schema_diff(url) == []
    assert open_store(url, caplog) == [] and snapshot(url) == after


def test_a_database_that_never_steered_gets_steering_version_0(url, caplog):
    rows = old_rows(1, steered=False)
    build(url, 1, rows)
    open_store(url, caplog)
    store = Store(url)
    try:
        assert (
            get_setting(store, "steering_version") == 0
            and get_setting(store, "active_profile") == "prof_2"
        )
        assert write_features(store, {("sae_a", 3): {"op": "add", "strength": 1.0}}) == 1
        assert get_setting(store, "steering_version") == 1
    finally:
        store.close()


def test_tables_without_a_schema_version_row_are_read_by_their_shape(url, caplog):
    # The old scheme made the tables, then wrote the row: a first start that stopped in between.
    rows = old_rows(3)
    build(url, 3, rows, schema_version_row=False)
    assert open_store(url, caplog) == [
        "stamp_revision  -> 0003",
        "upgrade 0003 -> 0004",
        "upgrade 0004 -> 0005",
        "upgrade 0005 -> 0006",
        "upgrade 0006 -> 0007",
        "upgrade 0007 -> 0008",
        "upgrade 0008 -> 0009",
        "upgrade 0009 -> 0010",
        "upgrade 0010 -> 0011",
        "upgrade 0011 -> 0012",
        "upgrade 0012 -> 0013",
        "upgrade 0013 -> 0014",
        "upgrade 0014 -> 0015",
        "upgrade 0015 -> 0016",
        "upgrade 0016 -> 0017",
    ]
    assert snapshot(url)["millm_profiles"] == in_order(upgraded(3, rows))["millm_profiles"]


def test_a_migration_that_fails_changes_nothing(url, caplog):
    # A schema-4 database that already has a millm_vectors table: revision 0005 cannot create it.
    rows = old_rows(4)
    build(url, 4, rows)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE millm_vectors (id VARCHAR(64) PRIMARY KEY)")
    engine.dispose()
    before = table_names(url)
    with pytest.raises(Exception, match="millm_vectors"):
        open_store(url, caplog)
    assert (
        table_names(url) == before
        and "alembic_version" not in before
        and "millm_probes" not in before
    )
    engine = create_engine(url)
    with engine.connect() as conn:
        assert [c["name"] for c in inspect(conn).get_columns("millm_strengths")] == [
            "sae_id",
            "feature",
            "strength",
        ]
        assert (
            conn.execute(
                text("SELECT value FROM millm_settings WHERE key = 'schema_version'")
            ).scalar()
            == "4"
        )
    engine.dispose()


def test_replicas_starting_together_on_an_empty_postgres_migrate_once(postgres_url, caplog):
    url = postgres_url
    barrier = threading.Barrier(2)
    stores: list[Store] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            stores.append(Store(url))
        except BaseException as exc:
            errors.append(exc)

    with caplog.at_level(logging.INFO, logger="alembic.runtime.migration"):
        threads = [threading.Thread(target=start) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    for store in stores:
        store.close()
    assert errors == [] and len(stores) == 2
    assert steps(caplog) == [
        f"upgrade {'' if v == 1 else revision_of(v - 1)} -> {revision_of(v)}"
        for v in range(1, SCHEMA_VERSION + 1)
    ]
    rows = snapshot(url)
    assert rows["alembic_version"] == [{"version_num": HEAD}]
    assert rows["millm_settings"] == [
        {"key": "schema_version", "value": str(SCHEMA_VERSION)},
        {"key": "steering_version", "value": "0"},
    ]


# A replica: ready once imported, migrates when told to go, then says how many steps it ran.
REPLICA = """
import logging, sys
from millm.store.database import Store
ran = []
handler = logging.Handler()
handler.emit = lambda record: ran.append(record.getMessage())
logging.getLogger("alembic.runtime.migration").addHandler(handler)
logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
print("ready", flush=True)
sys.stdin.readline()
Store(sys.argv[1]).close()
print(sum(message.startswith("Running upgrade") for message in ran))
"""


def test_two_replica_processes_starting_together_migrate_once(postgres_url):
    root = Path(__file__).resolve().parents[2]
    replicas = [
        subprocess.Popen(
            [sys.executable, "-c", REPLICA, postgres_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        for _ in range(2)
    ]
    for replica in replicas:
        assert replica.stdout is not None and replica.stdout.readline().strip() == "ready"
    for replica in replicas:  # both go as close together as two writes can
        assert replica.stdin is not None
        replica.stdin.write("go\n")
        replica.stdin.flush()
    outputs = [replica.communicate(timeout=60)[0].strip() for replica in replicas]
    assert [replica.returncode for replica in replicas] == [0, 0]
    assert sorted(int(out) for out in outputs) == [
        0,
        SCHEMA_VERSION,
    ]  # one made the schema, the other found it made
    assert snapshot(postgres_url)["alembic_version"] == [{"version_num": HEAD}]


def test_a_start_waits_while_another_holds_the_migration_lock(postgres_url):
    url = postgres_url
    holder = create_engine(url)
    stores: list[Store] = []
    thread = threading.Thread(target=lambda: stores.append(Store(url)))
    with holder.connect() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and table_names(url) == set()
        conn.commit()  # ends the transaction, and with it the lock
    thread.join(30)
    holder.dispose()
    assert not thread.is_alive() and len(stores) == 1
    stores[0].close()
    assert "millm_profiles" in table_names(url)
