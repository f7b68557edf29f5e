"""The Batch API's file store on a real SQLite store: whole or nothing, chunked, measured past a
cap, and a file past its retention expired when next read or swept (its record kept), unless a
live batch reads it."""

import io
import time
from types import SimpleNamespace

import pytest

from millm.errors import FileExpired
from millm.settings import Settings
from millm.store.batch_files import (
    CHUNK,
    Caps,
    OverCap,
    expire_files,
    file_bytes,
    file_row,
    store_file,
)
from millm.store.batches import insert_batch, update_batch
from millm.store.database import Store, database_url
from millm.v1.files.service import Files


@pytest.fixture
def store(tmp_path):
    opened = Store(database_url(tmp_path, None))
    yield opened
    opened.close()


def record(file_id: str, expires_at: int) -> dict:
    now = time.time()
    return {"id": file_id, "filename": "f.jsonl", "purpose": "batch", "status": "processed",
            "created_at": now, "expires_at": expires_at}  # fmt: skip


def test_a_file_is_stored_in_chunks_and_measured(store):
    data = b"a\n" * (CHUNK // 2) + b"tail"  # one full chunk, then a line without a newline
    measured = store_file(store, record("file-a", 2**31), io.BytesIO(data), Caps(10**9, 10**9))
    assert (measured.bytes, measured.lines) == (len(data), CHUNK // 2 + 1)
    assert [len(piece) for piece in file_bytes(store, "file-a")] == [CHUNK, 4]
    assert file_row(store, "file-a")["sha256"] == measured.sha256


def test_past_a_cap_nothing_is_stored_and_the_whole_file_is_counted(store):
    data = b"x\n" * 10
    with pytest.raises(OverCap) as info:
        store_file(store, record("file-b", 2**31), io.BytesIO(data), Caps(10**9, 4))
    assert (info.value.limit, info.value.most, info.value.measured) == ("rows", 4, 10)
    with pytest.raises(OverCap) as info:
        store_file(store, record("file-c", 2**31), io.BytesIO(data), Caps(5, 10**9))
    assert (info.value.limit, info.value.measured) == ("bytes", 20)
    assert file_row(store, "file-b") is None and file_row(store, "file-c") is None


def test_a_file_past_its_retention_is_expired_when_read(store, tmp_path):
    store_file(store, record("file-d", int(time.time()) - 1), io.BytesIO(b"{}\n"), Caps(99, 9))
    files = Files(SimpleNamespace(store=store, settings=Settings()))
    assert files.get("file-d").status == "expired"
    with pytest.raises(FileExpired):
        files.content("file-d")
    assert list(file_bytes(store, "file-d")) == [] and file_row(store, "file-d") is not None


def test_the_sweep_expires_what_is_due_and_spares_what_a_live_batch_reads(store):
    past, later = int(time.time()) - 1, int(time.time()) + 3600
    for file_id, expires_at in (("file-due", past), ("file-used", past), ("file-kept", later)):
        store_file(store, record(file_id, expires_at), io.BytesIO(b"{}\n"), Caps(99, 9))
    running = {"id": "batch_x", "status": "in_progress", "created_at": time.time(),
               "input_file_id": "file-used"}  # fmt: skip
    insert_batch(store, running)
    assert expire_files(store) == ["file-due"]
    assert [file_row(store, f)["status"] for f in ("file-due", "file-used", "file-kept")] == [
        "expired", "processed", "processed"]  # fmt: skip
    assert list(file_bytes(store, "file-used")) == [b"{}\n"]
    files = Files(SimpleNamespace(store=store, settings=Settings()))
    assert files.get("file-used").status == "processed"  # a read spares it too
    update_batch(store, "batch_x", lambda b: {**b, "status": "completed"})
    assert expire_files(store) == ["file-used"]
