"""Databases in the shape each schema version before Alembic (1 to 5) left them, with data in them.

The tables are written out as each version's millm/store/database.py declared them (see `git log
-p -- millm/store/database.py`) and made as that code made them: `metadata.create_all`, then the
`schema_version` setting as text. Nothing here imports millm's current tables, which describe
the newest schema.
"""

from __future__ import annotations

import copy
import json

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
    insert,
)

from millm.store.migrating import SCHEMA_VERSION

LEGACY_VERSIONS = (1, 2, 3, 4, 5)


def old_metadata(version: int) -> MetaData:
    """The tables of schema `version`, as its code declared them."""
    metadata = MetaData()
    _first_tables(metadata, with_ops=version >= 5)
    if version >= 2:
        _clusters_circuits(metadata)
    if version >= 3:
        _models(metadata)
    if version >= 4:
        _labels_calibrations(metadata)
    if version >= 5:
        _vectors_probes(metadata)
    return metadata


def _first_tables(metadata: MetaData, with_ops: bool) -> None:
    Table(
        "millm_settings",
        metadata,
        Column("key", String(64), primary_key=True),
        Column("value", Text, nullable=False),
    )
    Table(
        "millm_saes",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("info", Text, nullable=False),
        Column("registered_at", Float, nullable=False),
    )
    Table(
        "millm_attachments",
        metadata,
        Column("sae_id", String(64), ForeignKey("millm_saes.id"), primary_key=True),
        Column("layer", Integer, nullable=False),
    )
    # Schema 5 declared op and value in the table (create_all made them for a new database).
    ops = (
        [
            Column("op", String(16), nullable=False, server_default="add"),
            Column("value", Float, nullable=True),
        ]
        if with_ops
        else []
    )
    Table(
        "millm_strengths",
        metadata,
        Column("sae_id", String(64), primary_key=True),
        Column("feature", Integer, primary_key=True),
        Column("strength", Float, nullable=False),
        *ops,
    )
    Table(
        "millm_profiles",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("name", String(200), nullable=False, unique=True),
        Column("document", Text, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("updated_at", Float, nullable=False),
    )


def _clusters_circuits(metadata: MetaData) -> None:
    Table(
        "millm_clusters",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("name", String(200), nullable=False, unique=True),
        Column("raw", Text, nullable=False),
        Column("intensity", Float, nullable=False),
        Column("created_at", Float, nullable=False),
    )
    Table(
        "millm_circuits",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("name", String(200), nullable=False, unique=True),
        Column("raw", Text, nullable=False),
        Column("created_at", Float, nullable=False),
    )


def _models(metadata: MetaData) -> None:
    Table(
        "millm_models",
        metadata,
        Column("name", String(200), primary_key=True),
        Column("reference", Text, nullable=False),
        Column("info", Text, nullable=False),
        Column("registered_at", Float, nullable=False),
    )


def _labels_calibrations(metadata: MetaData) -> None:
    Table(
        "millm_feature_labels",
        metadata,
        Column("sae_id", String(64), primary_key=True),
        Column("feature", Integer, primary_key=True),
        Column("label", Text, nullable=False),
        Column("source", String(64), nullable=False),
        Column("detail", Text, nullable=False),
        Column("updated_at", Float, nullable=False),
    )
    Table(
        "millm_calibrations",
        metadata,
        Column("sae_id", String(64), primary_key=True),
        Column("model", String(200), primary_key=True),
        Column("summary", Text, nullable=False),
        Column("figures", Text, nullable=False),
        Column("created_at", Float, nullable=False),
    )


def _vectors_probes(metadata: MetaData) -> None:
    Table(
        "millm_vectors",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("name", String(200), nullable=False, unique=True),
        Column("description", Text, nullable=False),
        Column("model", String(200), nullable=False),
        Column("d_model", Integer, nullable=False),
        Column("layer", Integer, nullable=False),
        Column("hook_point", String(32), nullable=False),
        Column("method", String(32), nullable=False),
        Column("pairs", Integer, nullable=False),
        Column("norm", Float, nullable=False),
        Column("agreement", Float, nullable=True),
        Column("unit", LargeBinary, nullable=False),
        Column("created_at", Float, nullable=False),
    )
    Table(
        "millm_probes",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("name", String(200), nullable=False, unique=True),
        Column("document", Text, nullable=False),
        Column("active", Boolean, nullable=False, default=False),
        Column("created_at", Float, nullable=False),
        Column("updated_at", Float, nullable=False),
    )


# The data -----------------------------------------------------------------------------------------
# Times are exact in binary, so a float that changed on the way would show.
T0 = 1_764_000_000.0


def _sae(sae_id: str, layer: int) -> dict:
    info = {
        "id": sae_id,
        "format": "saelens",
        "path": f"/saes/{sae_id}",
        "architecture": "topk",
        "d_in": 4,
        "d_sae": 8,
        "layer": layer,
    }
    return {"id": sae_id, "info": json.dumps(info), "registered_at": T0 + layer}


def _profile(number: int, name: str, steering: list[dict]) -> dict:
    document = {
        "format": "millm.profile",
        "version": 1,
        "name": name,
        "description": f"profile {number}",
        "steering": steering,
    }
    return {
        "id": f"prof_{number}",
        "name": name,
        "document": json.dumps(document),
        "created_at": T0 + 10 * number + 0.25,
        "updated_at": T0 + 10 * number + 0.75,
    }


def _settings(version: int, steered: bool) -> list[dict]:
    # Schema 1 kept the active profile as `active_profile`; from schema 2 on it is `active_base`.
    active = (
        ("active_profile", json.dumps("prof_2"))
        if version == 1
        else ("active_base", json.dumps({"kind": "profile", "id": "prof_2"}))
    )
    rows = [("steering_enabled", json.dumps(True)), active]
    if steered:
        rows.append(("steering_version", json.dumps(7)))
    return [{"key": key, "value": value} for key, value in rows]


def _strengths(version: int) -> list[dict]:
    if version < 5:
        return [
            {"sae_id": "sae_a", "feature": 3, "strength": 5.0},
            {"sae_id": "sae_a", "feature": 11, "strength": -2.5},
            {"sae_id": "sae_b", "feature": 0, "strength": 0.125},
        ]
    return [
        {"sae_id": "sae_a", "feature": 3, "strength": 5.0, "op": "add", "value": None},
        {"sae_id": "sae_a", "feature": 11, "strength": 0.0, "op": "clamp", "value": 2.5},
        {"sae_id": "sae_b", "feature": 0, "strength": 0.0, "op": "ablate", "value": None},
    ]


def old_rows(version: int, steered: bool = True) -> dict[str, list[dict]]:
    """table -> rows that a user of schema `version` could have stored; `steered=False` is a
    database that never changed steering (no live values, no steering_version row)."""
    rows: dict[str, list[dict]] = {
        "millm_settings": _settings(version, steered),
        "millm_saes": [_sae("sae_a", 1), _sae("sae_b", 2)],
        "millm_attachments": [{"sae_id": "sae_a", "layer": 1}],
        "millm_strengths": _strengths(version) if steered else [],
        "millm_profiles": [
            _profile(1, "calm", [{"sae_id": "sae_a", "features": [{"index": 3, "strength": 4.0}]}]),
            _profile(2, "river-run", []),
            _profile(
                3, "ünïcode ✓", [{"sae_id": "sae_b", "features": [{"index": 0, "strength": -1.0}]}]
            ),
        ],
    }
    if version >= 2:
        rows["millm_clusters"] = [
            {
                "id": "clu_1",
                "name": "rivers",
                "raw": json.dumps({"name": "rivers", "members": [1, 2]}),
                "intensity": 0.5,
                "created_at": T0 + 100,
            },
            {
                "id": "clu_2",
                "name": "mountains",
                "raw": json.dumps({"name": "mountains", "members": []}),
                "intensity": 1.0,
                "created_at": T0 + 101,
            },
        ]
        rows["millm_circuits"] = [
            {
                "id": "cir_1",
                "name": "flow",
                "raw": json.dumps({"name": "flow", "layers": {"1": ["rivers"]}}),
                "created_at": T0 + 102,
            }
        ]
    if version >= 3:
        rows["millm_models"] = [
            {
                "name": "tiny",
                "reference": "/models/tiny",
                "info": json.dumps({"kind": "transformers", "owned_by": "me"}),
                "registered_at": T0 + 200,
            }
        ]
    if version >= 4:
        rows["millm_feature_labels"] = [
            {
                "sae_id": "sae_a",
                "feature": 3,
                "label": "water",
                "source": "neuronpedia",
                "detail": json.dumps({"top_tokens": ["river"]}),
                "updated_at": T0 + 300,
            },
            {
                "sae_id": "sae_a",
                "feature": 11,
                "label": "stone",
                "source": "plain",
                "detail": "{}",
                "updated_at": T0 + 301,
            },
        ]
        rows["millm_calibrations"] = [
            {
                "sae_id": "sae_a",
                "model": "tiny",
                "summary": json.dumps({"tokens": 4096}),
                "figures": json.dumps({"3": [0.5, 1.5]}),
                "created_at": T0 + 302,
            }
        ]
    if version >= 5:
        rows["millm_vectors"] = [
            {
                "id": "vec_1",
                "name": "calmer",
                "description": "calm minus angry",
                "model": "tiny",
                "d_model": 4,
                "layer": 1,
                "hook_point": "resid_post",
                "method": "mean_difference",
                "pairs": 16,
                "norm": 3.5,
                "agreement": 0.875,
                "unit": bytes(range(16)),
                "created_at": T0 + 400,
            },
            {
                "id": "vec_2",
                "name": "imported",
                "description": "",
                "model": "tiny",
                "d_model": 4,
                "layer": 2,
                "hook_point": "resid_post",
                "method": "imported",
                "pairs": 0,
                "norm": 1.0,
                "agreement": None,
                "unit": b"\x00\x00\x80\x3f" * 4,
                "created_at": T0 + 401,
            },
        ]
        rows["millm_probes"] = [
            {
                "id": "prb_1",
                "name": "water-watch",
                "document": json.dumps({"kind": "feature", "feature": 3}),
                "active": True,
                "created_at": T0 + 500,
                "updated_at": T0 + 501,
            },
            {
                "id": "prb_2",
                "name": "idle",
                "document": json.dumps({"kind": "weighted"}),
                "active": False,
                "created_at": T0 + 502,
                "updated_at": T0 + 503,
            },
        ]
    return rows


def build(
    url: str, version: int, rows: dict[str, list[dict]], schema_version_row: bool = True
) -> None:
    """Make the tables of schema `version` at `url`, store `rows` (table -> rows) and the
    schema_version setting as that version wrote it; without `schema_version_row`, a database
    whose first start stopped before writing it."""
    metadata = old_metadata(version)
    engine = create_engine(url)
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            for table in metadata.sorted_tables:
                if rows.get(table.name):
                    conn.execute(insert(table), rows[table.name])
            if schema_version_row:
                conn.execute(
                    insert(metadata.tables["millm_settings"]).values(
                        key="schema_version", value=str(version)
                    )
                )
    finally:
        engine.dispose()


def upgraded(version: int, rows: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """What `rows` of schema `version` must read as at the newest schema: the same rows, the new
    columns at their defaults, the newest schema_version and a steering_version (0 where there
    was none)."""
    expected = copy.deepcopy(rows)
    for row in expected.get("millm_attachments", []):
        row["model"] = None
    for row in expected.get("millm_profiles", []):
        row["version"] = 1
    for row in expected.get("millm_circuits", []):
        row["intensity"] = None  # schema 16: a circuit's persistent dial, unset
    if version < 5:
        for row in expected.get("millm_strengths", []):
            row.update(op="add", value=None)
    settings = {row["key"]: row["value"] for row in expected.get("millm_settings", [])}
    settings["schema_version"] = str(SCHEMA_VERSION)
    settings.setdefault("steering_version", "0")
    expected["millm_settings"] = [{"key": key, "value": value} for key, value in settings.items()]
    return expected
