"""Circuits' layer claims: the live ones, a circuit's claims added in one transaction (refused by
the database when another writer took one of its exclusive layers first), and claims released."""

from __future__ import annotations

import json
import time

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.schema import circuit_claims_table as claims


class ClaimTaken(Exception):
    """Another writer holds a layer this claim needed (the unique index refused it)."""


def live_claims(store: Store) -> list[dict]:
    """Every live claim, by layer then age: circuit_id, layer, claimed_at, composed,
    steering_keys ([feature, ...])."""
    query = (
        select(claims)
        .where(claims.c.released_at.is_(None))
        .order_by(claims.c.layer, claims.c.claimed_at)
    )
    with store.reading() as conn:
        rows = conn.execute(query).all()
    return [{**dict(r._mapping), "steering_keys": json.loads(r.steering_keys)} for r in rows]


def add_claims(store: Store, circuit_id: str, layers: dict[int, tuple[bool, list[int]]]) -> None:
    """Claim `layers` (layer -> (composed, features written there)) for a circuit, all or none;
    ClaimTaken when an exclusive layer is held already."""
    now = time.time()
    rows = [
        {"circuit_id": circuit_id, "layer": layer, "claimed_at": now, "released_at": None,
         "composed": composed, "steering_keys": json.dumps(sorted(keys))}
        for layer, (composed, keys) in sorted(layers.items())
    ]  # fmt: skip
    try:
        with store.transaction(Topic.STEERING) as conn:
            if rows:
                conn.execute(insert(claims), rows)
    except IntegrityError as exc:
        raise ClaimTaken(str(exc.orig)) from None


def release_claims(store: Store, circuit_ids: list[str]) -> list[int]:
    """Release these circuits' live claims (a layer they shared with one other circuit becomes
    that one's exclusive claim again); the layers released."""
    if not circuit_ids:
        return []
    mine = claims.c.circuit_id.in_(circuit_ids) & claims.c.released_at.is_(None)
    with store.transaction(Topic.STEERING) as conn:
        layers = conn.execute(select(claims.c.layer).where(mine)).scalars().all()
        conn.execute(update(claims).where(mine).values(released_at=time.time()))
        # a layer left with one claim is that circuit's alone again: exclusive, held by the index
        for layer in set(layers):
            left = (
                conn.execute(
                    select(claims.c.id).where(
                        claims.c.layer == layer, claims.c.released_at.is_(None)
                    )
                )
                .scalars()
                .all()
            )
            if len(left) == 1:
                conn.execute(update(claims).where(claims.c.id == left[0]).values(composed=False))
    return sorted(set(layers))
