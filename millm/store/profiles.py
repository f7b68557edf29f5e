"""The profiles' table: saved steering profiles, each row's document with a revision for
optimistic concurrency (a write naming the revision it read is refused when another came first)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from millm.errors import Conflict, NotFound, VersionConflict
from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import profiles_table


def _row(row) -> dict:
    return {
        "id": row.id,
        "name": row.name,
        "document": json.loads(row.document),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "revision": row.version,
    }


def profile_rows(store: Store, ids: list[str] | None = None) -> list[dict]:
    """Every profile row (or those of `ids`): {id, name, document, created_at, updated_at}, by
    name."""
    query = select(profiles_table).order_by(profiles_table.c.name)
    if ids is not None:
        query = query.where(profiles_table.c.id.in_(ids))
    with store.reading() as conn:
        rows = conn.execute(query).all()
    return [_row(row) for row in rows]


def insert_profiles(
    store: Store, rows: list[tuple[str, dict]], conn: Connection | None = None
) -> None:
    """Add profiles (id, document) in one transaction: all of them or none."""
    now = time.time()
    values = [
        {
            "id": pid,
            "name": doc["name"],
            "document": json.dumps(doc),
            "created_at": now,
            "updated_at": now,
        }
        for pid, doc in rows
    ]
    try:
        if conn is not None:
            conn.execute(insert(profiles_table), values)
            return
        with store.transaction(Topic.PROFILES) as c:
            c.execute(insert(profiles_table), values)
    except IntegrityError as exc:  # another replica took the name between the check and the write
        raise Conflict(
            "a profile with this name was created meanwhile (by another replica); choose another "
            "name",
            code="profile_exists",
        ) from exc


def update_profile(
    store: Store, profile_id: str, change: Callable[[dict], dict], expected: int | None = None
) -> None:
    """Rewrite a profile from its stored document as of this transaction (the row is locked until it
    commits): `change` maps it to the new one. With `expected`, VersionConflict unless that is still
    the stored revision; without, the change lands on whatever the last writer stored."""
    with store.transaction(Topic.PROFILES) as conn:
        row = conn.execute(
            select(profiles_table).where(profiles_table.c.id == profile_id).with_for_update()
        ).first()
        if row is None:
            raise NotFound(
                f"no profile with id {profile_id!r} (deleted meanwhile)",
                param="profile",
                code="profile_not_found",
            )
        if expected is not None and expected != row.version:
            raise VersionConflict(
                f"profile {row.name!r} is at revision {row.version}, not {expected}: it was "
                "changed since you read it; read it again and re-apply your change",
                param="revision",
            )
        document = change(json.loads(row.document))
        try:
            conn.execute(
                update(profiles_table)
                .where(profiles_table.c.id == profile_id)
                .values(
                    name=document["name"],
                    document=json.dumps(document),
                    updated_at=time.time(),
                    version=row.version + 1,
                )
            )
        except IntegrityError as exc:
            raise Conflict(
                f"a profile named {document['name']!r} exists already",
                param="name",
                code="profile_exists",
            ) from exc


def upgrade_profiles(store: Store, documents: dict[str, dict]) -> None:
    """Rewrite the documents of these profiles (id -> document) in one transaction, keeping
    their names and times: a format upgrade changes no profile's content or history."""
    with store.transaction(Topic.PROFILES) as conn:
        for profile_id, document in documents.items():
            conn.execute(
                update(profiles_table)
                .where(profiles_table.c.id == profile_id)
                .values(document=json.dumps(document))
            )


def delete_profile(store: Store, profile_id: str) -> None:
    """Remove a profile."""
    with store.transaction(Topic.PROFILES) as conn:
        conn.execute(delete(profiles_table).where(profiles_table.c.id == profile_id))
