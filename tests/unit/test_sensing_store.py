"""Sensing's stored events (millm/store/sensing.py): kept per cluster or circuit within a count and
an age, newest first, deleted with their base, and the claims table's one live exclusive claim per
layer (millm/store/claims.py), on a real SQLite store."""

from __future__ import annotations

import time

import pytest

from millm.store.claims import ClaimTaken, add_claims, live_claims, release_claims
from millm.store.database import Store, database_url
from millm.store.documents import delete_document, insert_documents
from millm.store.sensing import add_events, list_events, put_sensing, sensing_settings


@pytest.fixture
def store(tmp_path):
    s = Store(database_url(tmp_path, None))
    yield s
    s.close()


def event(base: str, n: int, at: float) -> dict:
    return {"id": f"sense_{base}_{n}", "base_id": base, "created_at": at, "pos_start": n}


def test_a_base_keeps_its_newest_events_within_the_count_and_the_age(store):
    now = time.time()
    add_events(store, "cluster", [event("a", n, now + n) for n in range(5)], keep=3, max_age_s=3600)
    add_events(store, "cluster", [event("b", 0, now)], keep=3, max_age_s=3600)
    kept, total = list_events(store, "cluster", "a", limit=10, since=None)
    assert total == 3 and [e["pos_start"] for e in kept] == [4, 3, 2]  # newest first
    assert list_events(store, "cluster", "b", 10, None)[1] == 1  # another base's are its own
    old = [event("a", 9, now - 8 * 86400)]
    add_events(store, "cluster", old, keep=3, max_age_s=7 * 86400)  # pruned as it is added
    assert [e["pos_start"] for e in list_events(store, "cluster", "a", 10, None)[0]] == [4, 3, 2]
    assert list_events(store, "cluster", None, 2, now + 2.5)[1] == 2  # after a time: 3 and 4


def test_a_deleted_base_takes_its_events_and_its_switch(store):
    insert_documents(
        store, "clusters", [{"id": "clu_1", "name": "c", "raw": "{}", "intensity": 1.0}]
    )
    put_sensing(store, "cluster", "clu_1", True, {"min_k": 2})
    add_events(store, "cluster", [event("clu_1", 0, time.time())], keep=10, max_age_s=3600)
    assert sensing_settings(store) == {("cluster", "clu_1"): (True, {"min_k": 2})}
    delete_document(store, "clusters", "clu_1")
    assert sensing_settings(store) == {} and list_events(store, "cluster", None, 10, None)[1] == 0


def test_one_live_exclusive_claim_per_layer(store):
    add_claims(store, "cir_a", {1: (False, [5]), 2: (False, [7])})
    with pytest.raises(ClaimTaken):  # another writer's exclusive claim on layer 2: all or none
        add_claims(store, "cir_b", {2: (False, [9]), 3: (False, [1])})
    assert [(c["circuit_id"], c["layer"]) for c in live_claims(store)] == [
        ("cir_a", 1),
        ("cir_a", 2),
    ]
    add_claims(store, "cir_c", {2: (True, [9])})  # composed beside it: the index allows it
    assert release_claims(store, ["cir_a"]) == [1, 2]
    [left] = live_claims(store)
    assert (left["circuit_id"], left["layer"], left["composed"]) == ("cir_c", 2, False)
    with pytest.raises(ClaimTaken):  # alone again, it is exclusive once more
        add_claims(store, "cir_d", {2: (False, [4])})
