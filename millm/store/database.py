"""Persistence: SQLite under the data directory by default, any SQLAlchemy URL (Postgres) by DATABASE_URL.

What survives a restart: registered SAEs, which are attached where, the live steering values
and whether steering is enabled, profiles (with the active one), clusters and circuits,
registered models (with the steering lock), probes (with which are active) and steering
vectors. The schema carries a version; `migrate` upgrades older databases in place and never drops a user's rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    create_engine,
    delete,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine

SCHEMA_VERSION = 5

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
attachments_table = Table(
    "millm_attachments",
    metadata,
    Column("sae_id", String(64), ForeignKey("millm_saes.id"), primary_key=True),
    Column("layer", Integer, nullable=False),
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

# Steering vectors (service/vectors.py): the unit direction as d_model little-endian float32 bytes
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

# version -> statements that bring a database from version-1 to it. Versions 2 to 4 only add
# tables (clusters and circuits; registered models; feature labels and calibrations), which
# create_all makes; no existing table changes, so every row of the older version is kept as it is.
# Version 5 adds the steering vectors' and probes' tables and gives each live steering value its
# op: the rows stored before are adds, as they meant. each live steering value its op: the rows stored before are adds, as they meant.


@dataclass(frozen=True)
class AddColumn:
    """ALTER TABLE ... ADD COLUMN, skipped where the column is there already (create_all made the
    table in its current shape, because the older database lacked it)."""

    table: str
    column: str
    definition: str


MIGRATIONS: dict[int, list[str | AddColumn]] = {
    2: [],
    3: [],
    4: [],
    5: [AddColumn("millm_strengths", "op", "VARCHAR(16) DEFAULT 'add' NOT NULL"), AddColumn("millm_strengths", "value", "FLOAT")],
}


def database_url(home: Path, url: str | None) -> str:
    """DATABASE_URL when given, else a SQLite file in the data directory."""
    return url or f"sqlite:///{home / 'millm.db'}"


class Store:
    """The database: small typed methods, each its own transaction unless one is open."""

    def __init__(self, url: str):
        self.url = url
        self.engine: Engine = create_engine(url, future=True, pool_pre_ping=True)
        self.migrate()

    def migrate(self) -> None:
        """Create missing tables and run pending migrations; existing rows are kept."""
        metadata.create_all(self.engine)
        with self.transaction() as conn:
            version = self._get(conn, "schema_version")
            current = int(version) if version is not None else SCHEMA_VERSION
            for target in range(current + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS.get(target, []):
                    if isinstance(step, AddColumn):
                        if step.column in {column["name"] for column in inspect(conn).get_columns(step.table)}:
                            continue
                        step = f"ALTER TABLE {step.table} ADD COLUMN {step.column} {step.definition}"
                    conn.exec_driver_sql(step)
            self._set(conn, "schema_version", str(SCHEMA_VERSION))

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One atomic unit: everything inside commits together or not at all."""
        with self.engine.begin() as conn:
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
        conn.execute(delete(settings_table).where(settings_table.c.key == key))
        if value is not None:
            conn.execute(insert(settings_table).values(key=key, value=value))

    def get_setting(self, key: str, default: Any = None) -> Any:
        """A JSON value stored under `key`."""
        with self.engine.connect() as conn:
            raw = self._get(conn, key)
        return default if raw is None else json.loads(raw)

    def set_setting(self, key: str, value: Any, conn: Connection | None = None) -> None:
        """Store a JSON value under `key` (None removes it)."""
        raw = None if value is None else json.dumps(value)
        if conn is not None:
            self._set(conn, key, raw)
            return
        with self.transaction() as c:
            self._set(c, key, raw)

    # SAEs and attachments -----------------------------------------------------------------------
    def saes(self) -> list[dict]:
        """Every registered SAE's info, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(saes_table).order_by(saes_table.c.registered_at)).all()
        return [json.loads(row.info) for row in rows]

    def add_sae(self, info: dict) -> None:
        """Register an SAE."""
        with self.transaction() as conn:
            conn.execute(insert(saes_table).values(id=info["id"], info=json.dumps(info), registered_at=time.time()))

    def remove_sae(self, sae_id: str) -> None:
        """Forget an SAE, its attachment and its live strengths (profiles keep their documents)."""
        with self.transaction() as conn:
            conn.execute(delete(attachments_table).where(attachments_table.c.sae_id == sae_id))
            conn.execute(delete(strengths_table).where(strengths_table.c.sae_id == sae_id))
            conn.execute(delete(saes_table).where(saes_table.c.id == sae_id))

    def attachments(self) -> dict[str, int]:
        """sae_id -> layer of every attached SAE."""
        with self.engine.connect() as conn:
            return {row.sae_id: row.layer for row in conn.execute(select(attachments_table))}

    def set_attachment(self, sae_id: str, layer: int | None) -> None:
        """Attach (layer) or detach (None) an SAE."""
        with self.transaction() as conn:
            conn.execute(delete(attachments_table).where(attachments_table.c.sae_id == sae_id))
            if layer is not None:
                conn.execute(insert(attachments_table).values(sae_id=sae_id, layer=layer))

    # live steering values --------------------------------------------------------------------------
    def live_features(self) -> dict[str, dict[int, dict]]:
        """sae_id -> {feature: {"op", "strength", "value"}}."""
        result: dict[str, dict[int, dict]] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(select(strengths_table)):
                result.setdefault(row.sae_id, {})[row.feature] = {"op": row.op, "strength": row.strength, "value": row.value}
        return result

    def write_features(self, changes: dict[tuple[str, int], dict | None], version: int, clear: str | bool = False) -> None:
        """Apply changes ((sae, feature) -> {"op", "strength", "value"}, None removes), optionally clearing first, atomically."""
        with self.transaction() as conn:
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
            self._set(conn, "steering_version", json.dumps(version))

    # profiles ----------------------------------------------------------------------------------------
    def profiles(self, ids: list[str] | None = None) -> list[dict]:
        """Every profile row (or those of `ids`): {id, name, document, created_at, updated_at}, by name."""
        query = select(profiles_table).order_by(profiles_table.c.name)
        if ids is not None:
            query = query.where(profiles_table.c.id.in_(ids))
        with self.engine.connect() as conn:
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
        }

    def insert_profiles(self, rows: list[tuple[str, dict]], conn: Connection | None = None) -> None:
        """Add profiles (id, document) in one transaction: all of them or none."""
        now = time.time()
        values = [
            {"id": pid, "name": doc["name"], "document": json.dumps(doc), "created_at": now, "updated_at": now}
            for pid, doc in rows
        ]
        if conn is not None:
            conn.execute(insert(profiles_table), values)
            return
        with self.transaction() as c:
            c.execute(insert(profiles_table), values)

    def replace_profile(self, profile_id: str, document: dict) -> None:
        """Overwrite a profile's document (its name may change)."""
        with self.transaction() as conn:
            conn.execute(
                update(profiles_table)
                .where(profiles_table.c.id == profile_id)
                .values(name=document["name"], document=json.dumps(document), updated_at=time.time())
            )

    def upgrade_profiles(self, documents: dict[str, dict]) -> None:
        """Rewrite the documents of these profiles (id -> document) in one transaction, keeping
        their names and times: a format upgrade changes no profile's content or history."""
        with self.transaction() as conn:
            for profile_id, document in documents.items():
                conn.execute(update(profiles_table).where(profiles_table.c.id == profile_id).values(document=json.dumps(document)))

    def delete_profile(self, profile_id: str) -> None:
        """Remove a profile."""
        with self.transaction() as conn:
            conn.execute(delete(profiles_table).where(profiles_table.c.id == profile_id))

    # clusters and circuits --------------------------------------------------------------------------
    def documents(self, table: str, ids: list[str] | None = None) -> list[dict]:
        """Rows of the clusters or circuits table (or those of `ids`), oldest first."""
        target = clusters_table if table == "clusters" else circuits_table
        query = select(target).order_by(target.c.created_at)
        if ids is not None:
            query = query.where(target.c.id.in_(ids))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [dict(row._mapping) for row in rows]

    def insert_documents(self, table: str, rows: list[dict]) -> None:
        """Add cluster or circuit rows in one transaction: all or none."""
        target = clusters_table if table == "clusters" else circuits_table
        now = time.time()
        with self.transaction() as conn:
            conn.execute(insert(target), [{**row, "created_at": now + i * 1e-6} for i, row in enumerate(rows)])

    def delete_document(self, table: str, document_id: str) -> None:
        """Remove a cluster or circuit."""
        target = clusters_table if table == "clusters" else circuits_table
        with self.transaction() as conn:
            conn.execute(delete(target).where(target.c.id == document_id))

    def set_cluster_intensity(self, cluster_id: str, intensity: float) -> None:
        """Store a cluster's persistent dial."""
        with self.transaction() as conn:
            conn.execute(update(clusters_table).where(clusters_table.c.id == cluster_id).values(intensity=intensity))

    # registered models -------------------------------------------------------------------------------
    def models(self) -> list[dict]:
        """Every registered model: {name, reference, info, registered_at}, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(models_table).order_by(models_table.c.registered_at)).all()
        return [{"name": r.name, "reference": r.reference, "info": json.loads(r.info), "registered_at": r.registered_at} for r in rows]

    def put_model(self, name: str, reference: str, info: dict, registered_at: float) -> None:
        """Register a model, or replace the registration of that name, in one transaction."""
        with self.transaction() as conn:
            conn.execute(delete(models_table).where(models_table.c.name == name))
            conn.execute(
                insert(models_table).values(name=name, reference=reference, info=json.dumps(info), registered_at=registered_at)
            )

    def remove_model(self, name: str) -> None:
        """Forget a registered model."""
        with self.transaction() as conn:
            conn.execute(delete(models_table).where(models_table.c.name == name))
