"""A batch's line queue on real stores (SQLite, and PostgreSQL as replicas share it): claims never
overlap, even when made at the same moment; a line whose claim lapsed is anyone's and is recorded
once; counts add up across writers; an ended batch records nothing more; a batch validated before
lines were queued is queued once with its unrecorded lines."""

from __future__ import annotations

import threading
import time

import pytest

from millm.store.batches import batch_row as read
from millm.store.batches import (
    claim_lines,
    drop_pending,
    hold_lines,
    insert_batch,
    queue_state,
    queue_unrecorded,
    record_lines,
    recorded,
    release_lines,
    validated,
)
from millm.store.database import Store, database_url


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        opened = Store(database_url(tmp_path, None))
    else:
        opened = Store(request.getfixturevalue("postgres").url)
    yield opened
    opened.close()


def new_batch(store: Store, lines: int, *, queued: bool = True) -> str:
    batch_id = f"batch_{time.monotonic_ns()}"
    batch = {
        "id": batch_id,
        "status": "validating",
        "created_at": time.time(),
        "input_file_id": "file-x",
        "request_counts": {"total": lines, "completed": 0, "failed": 0},
        "millm": {"waiting_reason": None},
    }
    insert_batch(store, batch)
    numbers = list(range(1, lines + 1)) if queued else []
    validated(store, batch_id, [], numbers, lambda b: {**b, "status": "in_progress"})
    return batch_id


def result(n: int, ok: bool = True) -> tuple[int, bool, dict]:
    return (n, ok, {"custom_id": f"c{n}"})


def test_claims_take_the_first_free_lines_and_never_overlap(store):
    batch = new_batch(store, 10)
    assert claim_lines(store, batch, "a", 4, 60) == [1, 2, 3, 4]
    assert claim_lines(store, batch, "b", 4, 60) == [5, 6, 7, 8]
    assert queue_state(store, batch, "a") == (10, 4)  # 10 pending, 4 held by b
    release_lines(store, batch, "b", [7, 8])
    assert claim_lines(store, batch, "c", 8, 60) == [7, 8, 9, 10]
    assert claim_lines(store, batch, "d", 8, 60) == []


def test_claims_made_at_once_by_many_writers_are_disjoint(store):
    batch = new_batch(store, 200)
    got: dict[str, list[int]] = {}
    start = threading.Barrier(4)

    def drain(name: str) -> None:
        start.wait()
        mine = got.setdefault(name, [])
        while lines := claim_lines(store, batch, name, 3, 60):
            mine.extend(lines)

    threads = [threading.Thread(target=drain, args=(f"r{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed = [n for lines in got.values() for n in lines]
    assert sorted(claimed) == list(range(1, 201))  # each line once


def test_a_lapsed_claim_is_taken_over_and_only_the_holder_records(store):
    batch = new_batch(store, 3)
    assert claim_lines(store, batch, "dead", 3, 0.05) == [1, 2, 3]
    time.sleep(0.1)
    assert claim_lines(store, batch, "alive", 2, 60) == [1, 2]
    hold_lines(store, batch, "dead", [3], 60)  # too late for 1 and 2: only 3 is still its own
    assert record_lines(store, batch, "dead", [result(1), result(2), result(3, ok=False)]) == [3]
    assert record_lines(store, batch, "alive", [result(1), result(2)]) == [1, 2]
    assert record_lines(store, batch, "alive", [result(1)]) == []  # recorded once
    counts = read(store, batch)["request_counts"]
    assert (counts["completed"], counts["failed"]) == (2, 1)
    assert sorted(recorded(store, batch)) == [1, 2, 3]
    assert queue_state(store, batch, "alive") == (0, 0)


def test_an_ended_batch_records_nothing_more(store):
    batch = new_batch(store, 2)
    assert claim_lines(store, batch, "a", 2, 60) == [1, 2]
    drop_pending(store, batch)
    assert record_lines(store, batch, "a", [result(1), result(2)]) == []
    assert read(store, batch)["request_counts"]["completed"] == 0


def test_a_batch_validated_before_the_queue_is_queued_once_without_its_recorded_lines(store):
    batch = new_batch(store, 0, queued=False)
    queue_unrecorded(store, batch, [1, 2, 3, 4])
    assert read(store, batch)["millm"]["queued"] is True
    assert claim_lines(store, batch, "a", 1, 60) == [1]
    record_lines(store, batch, "a", [result(1)])
    queue_unrecorded(store, batch, [1, 2, 3, 4])  # already queued: nothing changes
    assert queue_state(store, batch, "a") == (3, 0)
