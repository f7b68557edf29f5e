"""The store on SQLite: rows survive reopening, changes are atomic, migration keeps data."""

import pytest
from sqlalchemy.exc import IntegrityError

from millm.store.database import SCHEMA_VERSION, Store, database_url


@pytest.fixture
def store(tmp_path):
    s = Store(database_url(tmp_path, None))
    yield s
    s.close()


INFO = {"id": "sae_1", "format": "saelens", "path": "/x", "architecture": "topk", "d_in": 4, "d_sae": 8, "layer": 1,
        "hook_point": "resid_post", "hook_name": "blocks.1.hook_resid_post"}


def test_everything_survives_reopening(tmp_path):
    store = Store(database_url(tmp_path, None))
    store.add_sae(INFO)
    store.set_attachment("sae_1", 1)
    store.write_strengths({("sae_1", 3): 5.0, ("sae_1", 4): -2.0}, version=7)
    store.insert_profiles([("prof_1", {"name": "p", "steering": []})])
    store.set_setting("active_profile", "prof_1")
    store.close()
    again = Store(database_url(tmp_path, None))
    assert again.saes() == [INFO]
    assert again.attachments() == {"sae_1": 1}
    assert again.strengths() == {"sae_1": {3: 5.0, 4: -2.0}}
    assert again.get_setting("steering_version") == 7
    assert [p["name"] for p in again.profiles()] == ["p"]
    assert again.get_setting("active_profile") == "prof_1"
    assert again.get_setting("schema_version") == SCHEMA_VERSION
    again.close()


def test_strength_changes_and_clears(store):
    store.write_strengths({("a", 1): 1.0, ("b", 2): 2.0}, version=1)
    store.write_strengths({("a", 1): None, ("a", 5): 3.0}, version=2)
    assert store.strengths() == {"a": {5: 3.0}, "b": {2: 2.0}}
    store.write_strengths({}, version=3, clear="a")
    assert store.strengths() == {"b": {2: 2.0}}
    store.write_strengths({}, version=4, clear=True)
    assert store.strengths() == {}


def test_profile_insert_is_all_or_nothing(store):
    store.insert_profiles([("prof_1", {"name": "taken", "steering": []})])
    with pytest.raises(IntegrityError):
        store.insert_profiles([("prof_2", {"name": "fresh", "steering": []}), ("prof_3", {"name": "taken", "steering": []})])
    assert [p["name"] for p in store.profiles()] == ["taken"]


def test_a_schema_1_database_migrates_keeping_profiles(tmp_path):
    url = database_url(tmp_path, None)
    old = Store(url)
    old.insert_profiles([("prof_old", {"name": "kept", "steering": []})])
    old.set_setting("active_profile", "prof_old")
    with old.transaction() as conn:  # make it look like a schema-1 database
        conn.exec_driver_sql("DROP TABLE millm_clusters")
        conn.exec_driver_sql("DROP TABLE millm_circuits")
    old.set_setting("schema_version", 1)
    old.close()
    new = Store(url)
    assert new.get_setting("schema_version") == SCHEMA_VERSION == 5
    assert [p["name"] for p in new.profiles()] == ["kept"]
    assert new.get_setting("active_profile") == "prof_old"
    assert new.documents("clusters") == [] and new.documents("circuits") == []
    new.close()


def test_a_schema_4_database_gains_the_probes_table_keeping_everything(tmp_path):
    from millm.store.probes import insert_probes, probe_rows

    url = database_url(tmp_path, None)
    old = Store(url)
    old.insert_profiles([("prof_old", {"name": "kept", "steering": []})])
    with old.transaction() as conn:  # a version-4 database has no probes table
        conn.exec_driver_sql("DROP TABLE millm_probes")
    old.set_setting("schema_version", 4)
    old.close()
    new = Store(url)
    assert new.get_setting("schema_version") == 5
    assert [p["name"] for p in new.profiles()] == ["kept"]
    insert_probes(new, [("probe_1", {"name": "p", "detector": {}})])
    assert [(r["name"], r["active"]) for r in probe_rows(new)] == [("p", False)]
    new.close()
