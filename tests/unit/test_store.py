"""The store on SQLite: rows survive reopening, changes are atomic, migration keeps data."""

import json
import os

import pytest

from millm.errors import Conflict
from millm.kernel.books.profiles import ProfileBook
from millm.store.database import SCHEMA_VERSION, Store, database_url
from millm.store.profiles import insert_profiles, profile_rows
from millm.store.saes import add_sae, sae_rows
from millm.store.settings import get_setting, set_setting
from millm.store.steering import attachments, live_features, set_attachment, write_features
from tests.support.old_schemas import build


@pytest.fixture
def store(tmp_path):
    s = Store(database_url(tmp_path, None))
    yield s
    s.close()


INFO = {
    "id": "sae_1",
    "format": "saelens",
    "path": "/x",
    "architecture": "topk",
    "d_in": 4,
    "d_sae": 8,
    "layer": 1,
    "hook_point": "resid_post",
    "hook_name": "blocks.1.hook_resid_post",
}


def test_everything_survives_reopening(tmp_path):
    store = Store(database_url(tmp_path, None))
    add_sae(store, INFO)
    set_attachment(store, "sae_1", 1)
    write_features(store, {("sae_1", 3): add(5.0), ("sae_1", 4): {"op": "clamp", "value": 2.5}})
    insert_profiles(store, [("prof_1", {"name": "p", "steering": []})])
    set_setting(store, "active_profile", "prof_1")
    store.close()
    again = Store(database_url(tmp_path, None))
    assert sae_rows(again) == [INFO]
    assert attachments(again) == {"sae_1": 1}
    assert live_features(again) == {
        "sae_1": {3: add(5.0), 4: {"op": "clamp", "strength": 0.0, "value": 2.5}}
    }
    # one version per change: the attach, then the values
    assert get_setting(again, "steering_version") == 2
    assert [p["name"] for p in profile_rows(again)] == ["p"]
    assert get_setting(again, "active_profile") == "prof_1"
    assert get_setting(again, "schema_version") == SCHEMA_VERSION
    again.close()


def add(strength: float) -> dict:
    return {"op": "add", "strength": strength, "value": None}


def test_strength_changes_and_clears(store):
    write_features(store, {("a", 1): add(1.0), ("b", 2): add(2.0)})
    write_features(store, {("a", 1): None, ("a", 5): add(3.0), ("b", 3): {"op": "ablate"}})
    assert live_features(store) == {
        "a": {5: add(3.0)},
        "b": {2: add(2.0), 3: {"op": "ablate", "strength": 0.0, "value": None}},
    }
    write_features(store, {}, clear="a")
    assert set(live_features(store)) == {"b"}
    write_features(store, {}, clear=True)
    assert live_features(store) == {}


def test_profile_insert_is_all_or_nothing(store):
    insert_profiles(store, [("prof_1", {"name": "taken", "steering": []})])
    with pytest.raises(Conflict):
        insert_profiles(
            store,
            [
                ("prof_2", {"name": "fresh", "steering": []}),
                ("prof_3", {"name": "taken", "steering": []}),
            ],
        )
    assert [p["name"] for p in profile_rows(store)] == ["taken"]


# Every earlier schema version upgrading with its rows: tests/integration/test_migrations.py.


V1_PROFILE = {
    "kind": "millm.profile",
    "version": 1,
    "name": "old-calm",
    "description": "written by schema 4",
    "steering": [
        {
            "sae_id": "sae_1",
            "layer": 3,
            "features": [{"index": 2, "strength": 8.0}, {"index": 5, "strength": -1.5}],
        }
    ],
}


def schema_4_database(url: str) -> None:
    """A database as schema 4 left it: live values without ops, a version 1 profile stored as it
    was written."""
    build(
        url,
        4,
        {
            "millm_strengths": [
                {"sae_id": "sae_1", "feature": 2, "strength": 8.0},
                {"sae_id": "sae_1", "feature": 9, "strength": -40.0},
            ],
            "millm_profiles": [
                {
                    "id": "prof_v1",
                    "name": "old-calm",
                    "document": json.dumps(V1_PROFILE),
                    "created_at": 100.0,
                    "updated_at": 200.0,
                }
            ],
        },
    )


def test_a_schema_4_database_keeps_its_live_values_as_adds_and_its_profiles_as_version_2(tmp_path):
    url = database_url(tmp_path, None)
    schema_4_database(url)
    store = Store(url)
    assert get_setting(store, "schema_version") == SCHEMA_VERSION
    assert live_features(store) == {"sae_1": {2: add(8.0), 9: add(-40.0)}}
    book = ProfileBook(store)
    (row,) = profile_rows(store)
    assert (row["id"], row["name"], row["created_at"], row["updated_at"]) == (
        "prof_v1",
        "old-calm",
        100.0,
        200.0,
    )  # history kept
    expected = {
        **V1_PROFILE,
        "version": 2,
        "steering": [
            {
                "sae_id": "sae_1",
                "layer": 3,
                "features": [
                    {"index": 2, "op": "add", "strength": 8.0},
                    {"index": 5, "op": "add", "strength": -1.5},
                ],
            }
        ],
    }
    # the same entries, each feature an add, written back as version 2
    assert row["document"] == expected
    assert book.find("old-calm")["document"] == expected
    store.close()
    again = Store(url)  # reopening changes nothing more
    ProfileBook(again)
    assert profile_rows(again)[0]["document"] == expected and live_features(again) == {
        "sae_1": {2: add(8.0), 9: add(-40.0)}
    }
    again.close()


def test_a_stored_document_that_cannot_be_upgraded_is_kept_as_it_is(tmp_path):
    store = Store(database_url(tmp_path, None))
    broken = {
        **V1_PROFILE,
        "steering": [{"sae_id": "sae_1", "features": [{"index": 2, "strength": 900}]}],
    }  # edited by hand
    insert_profiles(store, [("prof_x", broken)])
    ProfileBook(store)
    assert profile_rows(store)[0]["document"] == broken
    store.close()


def test_one_process_holds_a_sqlite_file_and_the_lock_goes_with_it(tmp_path):
    from millm.store.single_process import DatabaseInUse, claim_sqlite

    url = database_url(tmp_path, None)
    held = claim_sqlite(url)
    # flock is per open file: a second claim, even from this process, is refused while the first is
    # held.
    with pytest.raises(
        DatabaseInUse,
        match=rf"another millm server \(pid {os.getpid()}\) is using the SQLite database",
    ):
        claim_sqlite(url)
    held.release()
    claim_sqlite(url).release()
    shared = (
        "postgresql+psycopg://u@h/db"  # a server database is shared by design: any number of claims
    )
    first, second = claim_sqlite(shared), claim_sqlite(shared)
    first.release(), second.release()
    # only the SQLite file got a lock file
    assert [p.name for p in tmp_path.glob("*.lock")] == ["millm.db.lock"]
