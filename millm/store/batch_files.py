"""The Batch API's files: a record each (never its bytes' place), the bytes in 1 MiB chunks.

A file is stored whole or not at all: its record and every chunk commit in one transaction, and
a file over a cap stores nothing, while its bytes and lines are still counted to the end so the
refusal says the measured size. Deleting or expiring a file drops its chunks and keeps its
record, so its id still says what became of it; a file a live batch reads never expires.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy import delete, insert, select, update

from millm.store.batches import LIVE
from millm.store.database import Store
from millm.store.schema import batch_file_chunks_table as chunks
from millm.store.schema import batch_files_table as files
from millm.store.schema import batches_table as batches

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Measured:
    """What a file held: its bytes, its lines (a last line without a newline counts) and digest."""

    bytes: int
    lines: int
    sha256: str


@dataclass(frozen=True)
class Caps:
    """The most bytes and lines a stored file may hold."""

    bytes: int
    lines: int


class OverCap(Exception):
    """The file passed a cap (`limit`: "bytes" or "rows"); nothing of it was stored."""

    def __init__(self, limit: str, most: int, measured: int):
        super().__init__(f"{limit} over {most}")
        self.limit, self.most, self.measured = limit, most, measured


def store_file(store: Store, record: dict, source: BinaryIO, caps: Caps) -> Measured:
    """Copy `source` into the store in chunks with `record` (id, filename, purpose, status,
    created_at, expires_at), in one transaction; OverCap, with nothing stored, past a cap."""
    digest, size, newlines, last = hashlib.sha256(), 0, 0, b""
    over = False
    with store.transaction() as conn:
        conn.execute(insert(files).values({**record, "bytes": 0, "lines": 0, "sha256": ""}))
        seq = 0
        while piece := source.read(CHUNK):
            size += len(piece)
            newlines += piece.count(b"\n")
            last = piece[-1:]
            lines = newlines + (0 if last == b"\n" else 1)
            over = over or size > caps.bytes or lines > caps.lines
            if over:
                continue  # keep counting: the refusal says what the file held
            digest.update(piece)
            conn.execute(insert(chunks).values(file_id=record["id"], seq=seq, data=piece))
            seq += 1
        lines = newlines + (1 if size and last != b"\n" else 0)
        if size > caps.bytes:
            raise OverCap("bytes", caps.bytes, size)
        if lines > caps.lines:
            raise OverCap("rows", caps.lines, lines)
        measured = Measured(size, lines, digest.hexdigest())
        conn.execute(
            update(files)
            .where(files.c.id == record["id"])
            .values(bytes=size, lines=lines, sha256=measured.sha256)
        )
    return measured


def file_row(store: Store, file_id: str) -> dict | None:
    """A file's record, or None."""
    with store.reading() as conn:
        row = conn.execute(select(files).where(files.c.id == file_id)).first()
    return dict(row._mapping) if row is not None else None


def file_rows(
    store: Store, purpose: str | None, after: str | None, limit: int, newest_first: bool
) -> list[dict]:
    """Up to `limit` records (of `purpose`), by creation time, after the file `after`."""
    query = select(files)
    if purpose is not None:
        query = query.where(files.c.purpose == purpose)
    order = (
        (files.c.created_at.desc(), files.c.id.desc())
        if newest_first
        else (files.c.created_at, files.c.id)
    )
    with store.reading() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query.order_by(*order)).all()]
    if after is not None:
        ids = [row["id"] for row in rows]
        rows = rows[ids.index(after) + 1 :] if after in ids else []
    return rows[:limit]


def file_bytes(store: Store, file_id: str) -> Iterator[bytes]:
    """A stored file's bytes, one chunk read at a time."""
    seq = 0
    while True:
        with store.reading() as conn:
            data = conn.execute(
                select(chunks.c.data).where(chunks.c.file_id == file_id, chunks.c.seq == seq)
            ).scalar()
        if data is None:
            return
        yield bytes(data)
        seq += 1


def drop_bytes(store: Store, file_id: str, status: str) -> None:
    """Drop a file's bytes and mark its record (`deleted`, `expired`)."""
    with store.transaction() as conn:
        conn.execute(delete(chunks).where(chunks.c.file_id == file_id))
        conn.execute(update(files).where(files.c.id == file_id).values(status=status))


def expire_files(store: Store, file_ids: list[str] | None = None) -> list[str]:
    """Mark expired, and drop the bytes of, the files (of `file_ids`, or all) past their
    retention that no live batch reads; the ids expired. The check and the drop share one
    transaction, so a batch made meanwhile never finds its input gone."""
    in_use = select(batches.c.input_file_id).where(batches.c.status.in_(LIVE))
    due = select(files.c.id).where(
        files.c.status == "processed",
        files.c.expires_at <= time.time(),
        files.c.id.not_in(in_use),
    )
    if file_ids is not None:
        due = due.where(files.c.id.in_(file_ids))
    with store.transaction() as conn:
        expired = list(conn.execute(due.with_for_update()).scalars())
        if expired:
            conn.execute(delete(chunks).where(chunks.c.file_id.in_(expired)))
            conn.execute(update(files).where(files.c.id.in_(expired)).values(status="expired"))
    return expired
