"""The books keep their tables in memory: writes are visible at once, a restart finds the same rows,
a deleted row is never served, a failed write makes the book read the store again, and one rename
rule (name-2, name-3, ... within 120 characters) serves profiles, clusters and circuits."""

import threading

import pytest
from sqlalchemy import event

from millm.errors import Conflict, NotFound
from millm.formats.profiles import validate_profile
from millm.kernel.books.base import NAME_LIMIT, unique_name, unique_names
from millm.kernel.books.documents import CircuitBook, ClusterBook
from millm.kernel.books.profiles import ProfileBook
from millm.store.database import Store, database_url
from millm.store.documents import insert_documents
from millm.store.profiles import insert_profiles
from tests.support.mistudio_docs import circuit, cluster, raw


@pytest.fixture
def store(tmp_path):
    s = Store(database_url(tmp_path, None))
    yield s
    s.close()


def profile(name, strength=1.0):
    return {
        "name": name,
        "steering": [{"sae_id": "sae_x", "features": [{"index": 3, "strength": strength}]}],
    }


def statements(store):
    """A list that every SQL statement the store sends from now on is appended to."""
    sent = []
    event.listen(
        store.engine, "before_cursor_execute", lambda conn, cursor, sql, *rest: sent.append(sql)
    )
    return sent


def test_profile_writes_are_visible_at_once_and_after_a_restart(store):
    book = ProfileBook(store)
    created = book.create(profile("alpha"))
    assert book.find("alpha") == created and book.find(created["id"]) == created
    book.create(profile("omega"))
    # moves to its new place by name
    book.update("alpha", {"name": "zeta", "description": "renamed"})
    assert [r["name"] for r in book.all()] == ["omega", "zeta"]
    book.delete("omega")
    book.update("zeta", {"name": "beta"})
    assert book.find(created["id"])["document"]["description"] == "renamed"
    with pytest.raises(NotFound):
        book.find("alpha")
    book.import_documents(
        {
            "kind": "millm.profile-bundle",
            "version": 1,
            "profiles": [profile("gamma"), profile("delta", 2.0)],
        },
        "fail",
    )
    again = ProfileBook(store)  # a restart: a new book over the same store
    assert again.all() == book.all()
    assert [r["name"] for r in again.all()] == ["beta", "delta", "gamma"]
    assert again.find("delta")["document"]["steering"][0]["features"] == [
        {"index": 3, "op": "add", "strength": 2.0}
    ]


def test_a_deleted_profile_is_never_served(store):
    book = ProfileBook(store)
    row = book.create(profile("gone"))
    shelf = book.shelf
    book.delete("gone")
    for key in ("gone", row["id"]):
        with pytest.raises(NotFound):
            book.find(key)
    assert book.all() == [] and ProfileBook(store).all() == []
    # a held shelf is a snapshot
    assert book.shelf.revision > shelf.revision and shelf.get("gone") is not None


def test_reads_do_not_touch_the_store(store):
    book = ProfileBook(store)
    book.create(profile("alpha"))
    sent = statements(store)
    for _ in range(3):
        book.find("alpha"), book.all()
    assert sent == []
    # a write: its insert, then its row read back (by id, not the table)
    book.create(profile("beta"))
    selects = [sql for sql in sent if "SELECT" in sql]
    assert len(sent) >= 2 and len(selects) == 1 and "WHERE millm_profiles.id IN" in selects[0]
    assert [r["name"] for r in book.all()] == ["alpha", "beta"]


def test_rows_handed_out_are_copies(store):
    book = ProfileBook(store)
    book.create(profile("alpha"))
    book.find("alpha")["name"] = "changed by a caller"
    book.all()[0]["id"] = "changed too"
    assert book.find("alpha")["name"] == "alpha" and book.all()[0]["id"].startswith("prof_")


def test_a_name_taken_outside_the_book_is_refused_by_the_store_and_then_found(store):
    book = ProfileBook(store)
    # A row the book did not write (another process, say): the book does not know its name...
    insert_profiles(store, [("prof_outside", validate_profile(profile("outside")))])
    with pytest.raises(Conflict) as refused:  # ...so the store's unique name refuses the duplicate
        book.create(profile("outside"))
    assert refused.value.code == "profile_exists"
    # A name the shelf lacks is looked up in the store once more before a 404 (another replica's
    # row).
    assert book.find("outside")["id"] == "prof_outside"
    with pytest.raises(Conflict):
        book.create(profile("outside"))


def test_concurrent_writes_lose_nothing(store):
    book = ProfileBook(store)

    def create(worker):
        for n in range(5):
            book.create(profile(f"w{worker}-{n}"))

    threads = [threading.Thread(target=create, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(book.all()) == 30 == len(ProfileBook(store).all())


def test_cluster_writes_dial_and_delete(store):
    book = ClusterBook(store, 2.0)
    (row,) = book.import_raw(raw(cluster(name="river")), "fail")
    assert book.find("river") == row and [r["id"] for r in book.all()] == [row["id"]]
    assert book.document(row) is book.document(book.find(row["id"]))  # parsed once, kept
    assert book.document(row)["members"][2]["strength"] == 150.0
    later = book.import_raw(raw(cluster(name="lake")), "fail")[0]
    assert book.set_intensity("river", 0.25)["intensity"] == 0.25
    assert (
        [r["name"] for r in book.all()]
        == ["river", "lake"]
        == [r["name"] for r in ClusterBook(store, 2.0).all()]
    )
    book.delete(later["id"])
    assert (
        book.find("river")["intensity"] == 0.25
        and ClusterBook(store, 2.0).find("river")["intensity"] == 0.25
    )
    book.delete(row["id"])
    with pytest.raises(NotFound):
        book.find("river")
    assert ClusterBook(store, 2.0).all() == []


def test_circuits_survive_a_restart_byte_for_byte(store):
    book = CircuitBook(store)
    body = raw(circuit(name="loop"))
    row = book.import_raw(body, "fail")
    again = CircuitBook(store)
    assert (
        again.find("loop")["raw"].encode() == body
        and again.document(again.find("loop"))["name"] == "loop"
    )
    assert again.find(row["id"]) == row


def test_a_damaged_stored_document_still_raises_where_it_is_used(store):
    book = ClusterBook(store, 2.0)
    insert_documents(
        store, "clusters", [{"id": "clu_bad", "name": "bad", "raw": "{not json", "intensity": 1.0}]
    )
    again = ClusterBook(store, 2.0)  # starts fine, and serves the row...
    row = again.find("bad")
    with pytest.raises(ValueError):  # ...whose document is refused where it is read, as before
        again.document(row)
    assert book.all() == []  # written past the book: unseen until a write through it reloads


def test_rename_rule():
    assert unique_name("river", set()) == "river"
    assert unique_name("river", {"river"}) == "river-2"
    assert unique_name("river", {"river", "river-2", "river-3"}) == "river-4"
    long = "x" * NAME_LIMIT
    renamed = unique_name(long, {long})
    assert renamed == "x" * 118 + "-2" and len(renamed) == NAME_LIMIT
    taken = {long} | {"x" * 118 + f"-{n}" for n in range(2, 10)}
    assert unique_name(long, taken) == "x" * 117 + "-10"
    assert unique_names(["a", "a", "b"], {"a"}) == ["a-2", "a-3", "b"]


def test_one_rename_rule_for_profiles_clusters_and_circuits(store):
    profiles, clusters, circuits = ProfileBook(store), ClusterBook(store, 2.0), CircuitBook(store)
    long = "p" * NAME_LIMIT
    profiles.create(profile(long))
    (renamed,) = profiles.import_documents(profile(long), "rename")
    # still a valid profile name: it exports and imports again
    assert renamed["name"] == "p" * 118 + "-2"
    assert validate_profile(renamed["document"])["name"] == renamed["name"]
    clusters.import_raw(raw(cluster(name="dup")), "fail")
    assert [r["name"] for r in clusters.import_raw(raw(cluster(name="dup")), "rename")] == ["dup-2"]
    long_cluster = "c" * NAME_LIMIT
    clusters.import_raw(raw(cluster(name=long_cluster)), "fail")
    (again,) = clusters.import_raw(raw(cluster(name=long_cluster)), "rename")
    assert again["name"] == "c" * 118 + "-2" and clusters.document(again)["name"] == again["name"]
    circuits.import_raw(raw(circuit(name="loop")), "fail")
    assert circuits.import_raw(raw(circuit(name="loop")), "rename")["name"] == "loop-2"
    with pytest.raises(Conflict):
        circuits.import_raw(raw(circuit(name="loop")), "fail")
