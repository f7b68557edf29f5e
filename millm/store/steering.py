"""The steering state's tables: live feature values, attachments, and the steering settings
(version, enabled, active base). Every change is one transaction that takes the next version."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, String, cast, delete, insert, select, update
from sqlalchemy.engine import Connection

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import attachments_table, settings_table, strengths_table
from millm.store.settings import write_raw

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
    """The writes of one steering change, inside its transaction; `version` is the state's new
    version. `written` records each write as it was stored, so the writer's own copy of the state
    can take the change without reading the whole state back."""

    conn: Connection
    version: int
    written: list[tuple] = field(default_factory=list)

    def features(
        self, changes: dict[tuple[str, int], dict | None], clear: str | bool = False
    ) -> None:
        """Apply live-value changes ((sae, feature) -> {"op", "strength", "value"}, None
        removes), optionally clearing first."""
        conn = self.conn
        if clear is True:
            conn.execute(delete(strengths_table))
        elif isinstance(clear, str):
            conn.execute(delete(strengths_table).where(strengths_table.c.sae_id == clear))
        for (sae_id, feature), setting in changes.items():
            where = (strengths_table.c.sae_id == sae_id) & (strengths_table.c.feature == feature)
            conn.execute(delete(strengths_table).where(where))
            if setting is not None:
                conn.execute(
                    insert(strengths_table).values(
                        sae_id=sae_id,
                        feature=feature,
                        op=setting["op"],
                        strength=setting.get("strength") or 0.0,
                        value=setting.get("value"),
                    )
                )
        self.written.append(("features", changes, clear))

    def attachment(self, sae_id: str, layer: int | None, model: str | None = None) -> None:
        """Attach (layer, on `model`) or detach (None) an SAE."""
        self.conn.execute(delete(attachments_table).where(attachments_table.c.sae_id == sae_id))
        if layer is not None:
            self.conn.execute(
                insert(attachments_table).values(sae_id=sae_id, layer=layer, model=model)
            )
        self.written.append(("attachment", sae_id, layer, model))

    def setting(self, key: str, value: Any) -> None:
        """One of the steering settings (enabled, the active base), as JSON; None removes it."""
        write_raw(self.conn, key, None if value is None else json.dumps(value))
        self.written.append(("setting", key, value))


def attachments(store: Store) -> dict[str, int]:
    """sae_id -> layer of every attached SAE."""
    return {sae_id: layer for sae_id, (layer, _) in attachment_rows(store).items()}


def attachment_rows(
    store: Store, conn: Connection | None = None
) -> dict[str, tuple[int, str | None]]:
    """sae_id -> (layer, the served model it was attached on; None for rows from before schema
    6)."""
    if conn is None:
        with store.reading() as c:
            return attachment_rows(store, c)
    return {row.sae_id: (row.layer, row.model) for row in conn.execute(select(attachments_table))}


def steering_state(store: Store) -> SteeringRows:
    """The whole steering state as of one moment (one read transaction)."""
    with store.reading() as plain:
        # PostgreSQL's default (read committed) lets each statement see a later commit; one snapshot
        # here.
        conn = plain.execution_options(isolation_level="REPEATABLE READ") if store.shared else plain
        with conn.begin():
            features: dict[str, dict[int, dict]] = {}
            for row in conn.execute(select(strengths_table)):
                features.setdefault(row.sae_id, {})[row.feature] = {
                    "op": row.op,
                    "strength": row.strength,
                    "value": row.value,
                }
            keyed = select(settings_table).where(settings_table.c.key.in_(STEERING_KEYS))
            settings = {row.key: json.loads(row.value) for row in conn.execute(keyed)}
            attached = attachment_rows(store, conn)
    legacy = settings.get("active_profile")  # schema 1 kept only a profile id
    active = settings.get("active_base", {"kind": "profile", "id": legacy} if legacy else None)
    return SteeringRows(
        int(settings.get("steering_version", 0)),
        bool(settings.get("steering_enabled", True)),
        active,
        features,
        attached,
    )


def live_features(store: Store) -> dict[str, dict[int, dict]]:
    """sae_id -> {feature: {"op", "strength", "value"}}."""
    return steering_state(store).features


@contextmanager
def steering_change(store: Store) -> Iterator[SteeringWriter]:
    """One change of the steering state: a transaction holding the next version (taken atomically,
    so two replicas never hand out the same one and their writes serialise), announced on commit."""
    with store.transaction(Topic.STEERING) as conn:
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


def write_features(
    store: Store, changes: dict[tuple[str, int], dict | None], clear: str | bool = False
) -> int:
    """Apply changes ((sae, feature) -> {"op", "strength", "value"}, None removes) as one steering
    change; returns its version."""
    with steering_change(store) as change:
        change.features(changes, clear)
    return change.version


def set_attachment(store: Store, sae_id: str, layer: int | None, model: str | None = None) -> int:
    """Attach (layer, on `model`) or detach (None) an SAE as one steering change; returns its
    version."""
    with steering_change(store) as change:
        change.attachment(sae_id, layer, model)
    return change.version
