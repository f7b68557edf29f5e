"""Persistence: SQLite under the data directory by default, any SQLAlchemy URL (Postgres) by DATABASE_URL.

What survives a restart: registered SAEs, which are attached where, the live steering values
and whether steering is enabled, profiles (with the active one), clusters and circuits,
registered models (with the steering lock), probes (with which are active) and steering
vectors. The schema is versioned by Alembic (one revision per version, in migrations/):
`Store.migrate` brings any older database, from schema 1 on, to the newest in place at start,
and never drops a user's rows.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    cast,
    create_engine,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from millm.errors import Conflict, NotFound, StoreUnavailable, VersionConflict
from millm.store.changes import LIVENESS, Topic, announce
from millm.store.migrating import SCHEMA_VERSION, one_migration_at_a_time, upgrade_to_head

metadata = MetaData()

settings_table = Table(
    "millm_settings",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)
saes_table = Table(
    "millm_saes",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("info", Text, nullable=False),  # JSON of SAEInfo
    Column("registered_at", Float, nullable=False),
)
# Which SAE is attached at which layer, and on which served model (`model`; NULL in rows from
# before schema 6: they attach on whichever model loads, as they did then). A replica serving
# another model does not attach it.
attachments_table = Table(
    "millm_attachments",
    metadata,
    Column("sae_id", String(64), ForeignKey("millm_saes.id"), primary_key=True),
    Column("layer", Integer, nullable=False),
    Column("model", String(200), nullable=True),
)
# The live steering values: one row per (SAE, feature), its op and what the op takes (add: a
# strength; clamp and cap: a value; ablate: neither). `strength` is 0 for the ops other than add:
# it was NOT NULL before ops existed, and SQLite cannot drop that in place.
strengths_table = Table(
    "millm_strengths",
    metadata,
    Column("sae_id", String(64), primary_key=True),
    Column("feature", Integer, primary_key=True),
    Column("strength", Float, nullable=False),
    Column("op", String(16), nullable=False, server_default="add"),
    Column("value", Float, nullable=True),
)
profiles_table = Table(
    "millm_profiles",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("document", Text, nullable=False),  # the versioned profile document, as JSON
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # Optimistic concurrency: every write of the row adds one, and a write that names the version
    # it read is refused (409) when another writer got there first.
    Column("version", Integer, nullable=False, server_default="1"),
)

clusters_table = Table(
    "millm_clusters",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("raw", Text, nullable=False),  # the document exactly as imported
    Column("intensity", Float, nullable=False),  # the persistent dial
    Column("created_at", Float, nullable=False),
)
circuits_table = Table(
    "millm_circuits",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("raw", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

models_table = Table(
    "millm_models",
    metadata,
    Column("name", String(200), primary_key=True),  # the name clients send as `model`
    Column("reference", Text, nullable=False),  # what was registered: a path, a .gguf file or a hub id
    Column("info", Text, nullable=False),  # JSON: kind, owned_by, and what inspection found
    Column("registered_at", Float, nullable=False),
)

# Feature labels: one row per (SAE, feature); `detail` keeps what the source said beside the
# label (explainer model, type, top tokens, an example), as JSON.
feature_labels_table = Table(
    "millm_feature_labels",
    metadata,
    Column("sae_id", String(64), primary_key=True),
    Column("feature", Integer, primary_key=True),
    Column("label", Text, nullable=False),
    Column("source", String(64), nullable=False),  # neuronpedia | mistudio | plain | sae_file
    Column("detail", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)
# A calibration of one SAE on one model's residuals: what the corpus was (`summary`, JSON) and
# every feature's figures (`figures`, JSON).
calibrations_table = Table(
    "millm_calibrations",
    metadata,
    Column("sae_id", String(64), primary_key=True),
    Column("model", String(200), primary_key=True),
    Column("summary", Text, nullable=False),
    Column("figures", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Steering vectors (service/steering/vectors.py): the unit direction as d_model little-endian float32 bytes
# (read back bit for bit), its trained length and where and on which model it was trained.
vectors_table = Table(
    "millm_vectors",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("description", Text, nullable=False),
    Column("model", String(200), nullable=False),  # the served model name it was trained on
    Column("d_model", Integer, nullable=False),
    Column("layer", Integer, nullable=False),
    Column("hook_point", String(32), nullable=False),
    Column("method", String(32), nullable=False),
    Column("pairs", Integer, nullable=False),
    Column("norm", Float, nullable=False),
    Column("agreement", Float, nullable=True),  # null for an imported vector
    Column("unit", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Probes: a named detector (the versioned probe document, as JSON) and whether it is active,
# i.e. watches every generation request.
probes_table = Table(
    "millm_probes",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("document", Text, nullable=False),
    Column("active", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# Stored Responses API answers (store/responses.py): the response object and the conversation it
# answered (input items, earlier turns included), both as JSON, for GET and previous_response_id.
responses_table = Table(
    "millm_responses",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Float, nullable=False, index=True),
    Column("response", Text, nullable=False),
    Column("items", Text, nullable=False),
)


def database_url(home: Path, url: str | None) -> str:
    """DATABASE_URL when given, else a SQLite file in the data directory."""
    return url or f"sqlite:///{home / 'millm.db'}"


STEERING_KEYS = ("steering_version", "steering_enabled", "active_base", "active_profile")


@dataclass(frozen=True)
class SteeringRows:
    """The stored steering state: version, enabled, active base, live values and attachments."""

    version: int
    enabled: bool
    active: dict | None
    features: dict[str, dict[int, dict]]
    attachments: dict[str, tuple[int, str | None]]


@dataclass(frozen=True)
class SteeringWriter:
    """The writes of one steering change, inside its transaction; `version` is the state's new version."""

    conn: Connection
    version: int

    def features(self, changes: dict[tuple[str, int], dict | None], clear: str | bool = False) -> None:
        """Apply live-value changes ((sae, feature) -> {"op", "strength", "value"}, None removes), optionally clearing first."""
        conn = self.conn
        if clear is True:
            conn.execute(delete(strengths_table))
        elif isinstance(clear, str):
            conn.execute(delete(strengths_table).where(strengths_table.c.sae_id == clear))
        for (sae_id, feature), setting in changes.items():
            where = (strengths_table.c.sae_id == sae_id) & (strengths_table.c.feature == feature)
            conn.execute(delete(strengths_table).where(where))
            if setting is not None:
                conn.execute(insert(strengths_table).values(
                    sae_id=sae_id, feature=feature, op=setting["op"], strength=setting.get("strength") or 0.0, value=setting.get("value")))

    def attachment(self, sae_id: str, layer: int | None, model: str | None = None) -> None:
        """Attach (layer, on `model`) or detach (None) an SAE."""
        self.conn.execute(delete(attachments_table).where(attachments_table.c.sae_id == sae_id))
        if layer is not None:
            self.conn.execute(insert(attachments_table).values(sae_id=sae_id, layer=layer, model=model))

    def setting(self, key: str, value: Any) -> None:
        """One of the steering settings (enabled, the active base), as JSON; None removes it."""
        Store._set(self.conn, key, None if value is None else json.dumps(value))


class Store:
    """The database: small typed methods, each its own transaction unless one is open."""

    def __init__(self, url: str):
        self.url = url
        # On PostgreSQL the pool's connections get the listener's limits: a write never hangs on a dead peer.
        connect_args = LIVENESS if make_url(url).get_backend_name() == "postgresql" else {}
        self.engine: Engine = create_engine(url, future=True, pool_pre_ping=True, connect_args=connect_args)
        self.migrate()

    def migrate(self) -> None:
        """Bring the schema to the newest revision through Alembic, in one transaction; existing rows are kept."""
        # Only reaching the database is store_unavailable: a migration that fails says why itself,
        # where unavailable_as_503 would call SQLite's "table already exists" a connection problem.
        with unavailable_as_503():
            conn = self.engine.connect()
        with conn, conn.begin(), one_migration_at_a_time(conn):
            upgrade_to_head(conn)
            # Kept for older code and tools that read the version from the settings.
            if self._get(conn, "schema_version") != str(SCHEMA_VERSION):
                self._set(conn, "schema_version", str(SCHEMA_VERSION))

    @cached_property
    def origin(self) -> str:
        """This process's name in change notices, so it can tell its own writes from other replicas'."""
        return uuid.uuid4().hex[:12]

    @property
    def shared(self) -> bool:
        """Whether other processes may share this database (PostgreSQL), so changes are announced and listened for."""
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

    # settings -------------------------------------------------------------------------------
    @staticmethod
    def _get(conn: Connection, key: str) -> str | None:
        return conn.execute(select(settings_table.c.value).where(settings_table.c.key == key)).scalar()

    @staticmethod
    def _set(conn: Connection, key: str, value: str | None) -> None:
        if value is None:
            conn.execute(delete(settings_table).where(settings_table.c.key == key))
        else:
            upsert(conn, settings_table, {"key": key, "value": value})

    def get_setting(self, key: str, default: Any = None) -> Any:
        """A JSON value stored under `key`."""
        with self.reading() as conn:
            raw = self._get(conn, key)
        return default if raw is None else json.loads(raw)

    def set_setting(self, key: str, value: Any, conn: Connection | None = None, topic: Topic | None = None) -> None:
        """Store a JSON value under `key` (None removes it); other replicas are told about `topic`, if given."""
        raw = None if value is None else json.dumps(value)
        if conn is not None:
            self._set(conn, key, raw)
            return
        with self.transaction(*([topic] if topic else [])) as c:
            self._set(c, key, raw)

    # SAEs and attachments -----------------------------------------------------------------------
    def saes(self) -> list[dict]:
        """Every registered SAE's info, oldest first."""
        with self.reading() as conn:
            rows = conn.execute(select(saes_table).order_by(saes_table.c.registered_at)).all()
        return [json.loads(row.info) for row in rows]

    def add_sae(self, info: dict) -> None:
        """Register an SAE (again: the id is its weights' hash, so two replicas registering one file agree)."""
        with self.transaction(Topic.SAES) as conn:
            upsert(conn, saes_table, {"id": info["id"], "info": json.dumps(info), "registered_at": time.time()})

    def remove_sae(self, sae_id: str) -> None:
        """Forget an SAE, its attachment and its live strengths (profiles keep their documents)."""
        with self.transaction(Topic.SAES, Topic.STEERING) as conn:
            conn.execute(delete(attachments_table).where(attachments_table.c.sae_id == sae_id))
            conn.execute(delete(strengths_table).where(strengths_table.c.sae_id == sae_id))
            conn.execute(delete(saes_table).where(saes_table.c.id == sae_id))

    def attachments(self) -> dict[str, int]:
        """sae_id -> layer of every attached SAE."""
        return {sae_id: layer for sae_id, (layer, _) in self.attachment_rows().items()}

    def attachment_rows(self, conn: Connection | None = None) -> dict[str, tuple[int, str | None]]:
        """sae_id -> (layer, the served model it was attached on; None for rows from before schema 6)."""
        if conn is None:
            with self.reading() as c:
                return self.attachment_rows(c)
        return {row.sae_id: (row.layer, row.model) for row in conn.execute(select(attachments_table))}

    # the steering state ------------------------------------------------------------------------------
    def steering_state(self) -> SteeringRows:
        """The whole steering state as of one moment (one read transaction)."""
        with self.reading() as plain:
            # PostgreSQL's default (read committed) lets each statement see a later commit; one snapshot here.
            conn = plain.execution_options(isolation_level="REPEATABLE READ") if self.shared else plain
            with conn.begin():
                features: dict[str, dict[int, dict]] = {}
                for row in conn.execute(select(strengths_table)):
                    features.setdefault(row.sae_id, {})[row.feature] = {"op": row.op, "strength": row.strength, "value": row.value}
                settings = {row.key: json.loads(row.value) for row in conn.execute(select(settings_table).where(settings_table.c.key.in_(STEERING_KEYS)))}
                attachments = self.attachment_rows(conn)
        legacy = settings.get("active_profile")  # schema 1 kept only a profile id
        active = settings.get("active_base", {"kind": "profile", "id": legacy} if legacy else None)
        return SteeringRows(int(settings.get("steering_version", 0)), bool(settings.get("steering_enabled", True)), active, features, attachments)

    def live_features(self) -> dict[str, dict[int, dict]]:
        """sae_id -> {feature: {"op", "strength", "value"}}."""
        return self.steering_state().features

    @contextmanager
    def steering_change(self) -> Iterator[SteeringWriter]:
        """One change of the steering state: a transaction holding the next version (taken atomically,
        so two replicas never hand out the same one and their writes serialise), announced on commit."""
        with self.transaction(Topic.STEERING) as conn:
            bumped = conn.execute(
                update(settings_table)
                .where(settings_table.c.key == "steering_version")
                .values(value=cast(cast(settings_table.c.value, Integer) + 1, String))
                .returning(settings_table.c.value)
            ).scalar()
            if bumped is None:  # a database that never stored a version (the migration seeds it)
                conn.execute(insert(settings_table).values(key="steering_version", value="1"))
                bumped = "1"
            yield SteeringWriter(conn, int(bumped))

    def write_features(self, changes: dict[tuple[str, int], dict | None], clear: str | bool = False) -> int:
        """Apply changes ((sae, feature) -> {"op", "strength", "value"}, None removes) as one steering change; returns its version."""
        with self.steering_change() as change:
            change.features(changes, clear)
        return change.version

    def set_attachment(self, sae_id: str, layer: int | None, model: str | None = None) -> int:
        """Attach (layer, on `model`) or detach (None) an SAE as one steering change; returns its version."""
        with self.steering_change() as change:
            change.attachment(sae_id, layer, model)
        return change.version

    # profiles ----------------------------------------------------------------------------------------
    def profiles(self, ids: list[str] | None = None) -> list[dict]:
        """Every profile row (or those of `ids`): {id, name, document, created_at, updated_at}, by name."""
        query = select(profiles_table).order_by(profiles_table.c.name)
        if ids is not None:
            query = query.where(profiles_table.c.id.in_(ids))
        with self.reading() as conn:
            rows = conn.execute(query).all()
        return [self._profile_row(row) for row in rows]

    @staticmethod
    def _profile_row(row) -> dict:
        return {
            "id": row.id,
            "name": row.name,
            "document": json.loads(row.document),
            "created_at": row.created_at,
            "updated_at": row.updated_at,
            "revision": row.version,
        }

    def insert_profiles(self, rows: list[tuple[str, dict]], conn: Connection | None = None) -> None:
        """Add profiles (id, document) in one transaction: all of them or none."""
        now = time.time()
        values = [
            {"id": pid, "name": doc["name"], "document": json.dumps(doc), "created_at": now, "updated_at": now}
            for pid, doc in rows
        ]
        try:
            if conn is not None:
                conn.execute(insert(profiles_table), values)
                return
            with self.transaction(Topic.PROFILES) as c:
                c.execute(insert(profiles_table), values)
        except IntegrityError as exc:  # another replica took the name between the check and the write
            raise Conflict("a profile with this name was created meanwhile (by another replica); choose another name", code="profile_exists") from exc

    def update_profile(self, profile_id: str, change: Callable[[dict], dict], expected: int | None = None) -> None:
        """Rewrite a profile from its stored document as of this transaction (the row is locked until it
        commits): `change` maps it to the new one. With `expected`, VersionConflict unless that is still
        the stored revision; without, the change lands on whatever the last writer stored."""
        with self.transaction(Topic.PROFILES) as conn:
            row = conn.execute(select(profiles_table).where(profiles_table.c.id == profile_id).with_for_update()).first()
            if row is None:
                raise NotFound(f"no profile with id {profile_id!r} (deleted meanwhile)", param="profile", code="profile_not_found")
            if expected is not None and expected != row.version:
                raise VersionConflict(
                    f"profile {row.name!r} is at revision {row.version}, not {expected}: it was changed since you read it; "
                    "read it again and re-apply your change",
                    param="revision",
                )
            document = change(json.loads(row.document))
            try:
                conn.execute(
                    update(profiles_table)
                    .where(profiles_table.c.id == profile_id)
                    .values(name=document["name"], document=json.dumps(document), updated_at=time.time(), version=row.version + 1)
                )
            except IntegrityError as exc:
                raise Conflict(f"a profile named {document['name']!r} exists already", param="name", code="profile_exists") from exc

    def upgrade_profiles(self, documents: dict[str, dict]) -> None:
        """Rewrite the documents of these profiles (id -> document) in one transaction, keeping
        their names and times: a format upgrade changes no profile's content or history."""
        with self.transaction(Topic.PROFILES) as conn:
            for profile_id, document in documents.items():
                conn.execute(update(profiles_table).where(profiles_table.c.id == profile_id).values(document=json.dumps(document)))

    def delete_profile(self, profile_id: str) -> None:
        """Remove a profile."""
        with self.transaction(Topic.PROFILES) as conn:
            conn.execute(delete(profiles_table).where(profiles_table.c.id == profile_id))

    # clusters and circuits --------------------------------------------------------------------------
    def documents(self, table: str, ids: list[str] | None = None) -> list[dict]:
        """Rows of the clusters or circuits table (or those of `ids`), oldest first."""
        target = clusters_table if table == "clusters" else circuits_table
        query = select(target).order_by(target.c.created_at)
        if ids is not None:
            query = query.where(target.c.id.in_(ids))
        with self.reading() as conn:
            rows = conn.execute(query).all()
        return [dict(row._mapping) for row in rows]

    def insert_documents(self, table: str, rows: list[dict]) -> None:
        """Add cluster or circuit rows in one transaction: all or none."""
        target = clusters_table if table == "clusters" else circuits_table
        now = time.time()
        with self.transaction(_topic(table)) as conn:
            conn.execute(insert(target), [{**row, "created_at": now + i * 1e-6} for i, row in enumerate(rows)])

    def delete_document(self, table: str, document_id: str) -> None:
        """Remove a cluster or circuit."""
        target = clusters_table if table == "clusters" else circuits_table
        with self.transaction(_topic(table)) as conn:
            conn.execute(delete(target).where(target.c.id == document_id))

    def set_cluster_intensity(self, cluster_id: str, intensity: float) -> None:
        """Store a cluster's persistent dial."""
        with self.transaction(Topic.CLUSTERS) as conn:
            conn.execute(update(clusters_table).where(clusters_table.c.id == cluster_id).values(intensity=intensity))

    # registered models -------------------------------------------------------------------------------
    def models(self) -> list[dict]:
        """Every registered model: {name, reference, info, registered_at}, oldest first."""
        with self.reading() as conn:
            rows = conn.execute(select(models_table).order_by(models_table.c.registered_at)).all()
        return [{"name": r.name, "reference": r.reference, "info": json.loads(r.info), "registered_at": r.registered_at} for r in rows]

    def put_model(self, name: str, reference: str, info: dict, registered_at: float) -> None:
        """Register a model, or replace the registration of that name, in one transaction."""
        with self.transaction(Topic.MODELS) as conn:
            upsert(conn, models_table, {"name": name, "reference": reference, "info": json.dumps(info), "registered_at": registered_at})

    def remove_model(self, name: str) -> None:
        """Forget a registered model."""
        with self.transaction(Topic.MODELS) as conn:
            conn.execute(delete(models_table).where(models_table.c.name == name))


def _topic(table: str) -> Topic:
    return Topic.CLUSTERS if table == "clusters" else Topic.CIRCUITS


@contextmanager
def unavailable_as_503() -> Iterator[None]:
    """A database that cannot be reached (connection refused or lost, SQLite locked) is 503
    store_unavailable, never a bare 500: the client may retry, nothing was half written."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable(f"the database cannot be reached ({_first_line(exc)}); nothing was changed; retry") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailable(f"the database connection was lost ({_first_line(exc)}); nothing was changed; retry") from exc
        raise


def _first_line(exc: DBAPIError) -> str:
    lines = str(exc.orig).strip().splitlines() if exc.orig is not None else []
    return lines[0] if lines else type(exc).__name__


def upsert(conn: Connection, table: Table, values: dict[str, Any]) -> None:
    """Insert a row, or overwrite the one with its primary key. One statement, not delete-then-insert:
    two replicas writing one key at once would both insert, and one would fail."""
    keys = list(table.primary_key.columns)
    changes = {name: value for name, value in values.items() if name not in {c.name for c in keys}}
    if conn.dialect.name == "postgresql":
        conn.execute(postgresql_insert(table).values(**values).on_conflict_do_update(index_elements=keys, set_=changes))
    elif conn.dialect.name == "sqlite":
        conn.execute(sqlite_insert(table).values(**values).on_conflict_do_update(index_elements=keys, set_=changes))
    else:  # another database serves one process: delete-then-insert cannot race there
        conn.execute(delete(table).where(*(c == values[c.name] for c in keys)))
        conn.execute(insert(table).values(**values))
