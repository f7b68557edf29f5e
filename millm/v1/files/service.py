"""/v1/files: store a JSONL file whole (or nothing, past a cap), list, read, stream and delete.

Blocking (the store): the routes are plain functions, which FastAPI runs on its worker pool. A
file past its retention is marked expired when it is next read (its bytes dropped, its record
kept), so its id says what became of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import BinaryIO

from millm.errors import (
    BatchFileLimit,
    FileDeleted,
    FileExpired,
    FileInUse,
    FileNotFound,
    InvalidBatchRequest,
)
from millm.store.batch_files import (
    Caps,
    OverCap,
    drop_bytes,
    expire_files,
    file_bytes,
    file_row,
    file_rows,
    store_file,
)
from millm.store.batches import file_in_use
from millm.store.database import Store
from millm.v1.files.parts import FileParts
from millm.v1.files.protocol import PURPOSES, FileDeletedBody, FileList, FileObject
from millm.v1.objects import hex_id

DAY_S = 86_400
MAX_FILENAME = 255
DEFAULT_FILENAME = "upload.jsonl"


def new_file_id() -> str:
    """`file-` and 24 hex digits, as OpenAI's ids look."""
    return hex_id("file-")


def current_row(store: Store, file_id: str, param: str = "file_id") -> dict:
    """A file's record (404 file_not_found), marked expired (its bytes dropped) once its
    retention ended."""
    row = file_row(store, file_id)
    if row is None:
        raise FileNotFound(f"no file {file_id!r}", param=param)
    return aged(store, row)


def aged(store: Store, row: dict) -> dict:
    """The record as it is now: expired (its bytes dropped) once its retention ended, unless a
    live batch reads it."""
    due = row["status"] == "processed" and row["expires_at"] <= time.time()
    if due and expire_files(store, [row["id"]]):
        return {**row, "status": "expired"}
    return row


def readable_row(store: Store, file_id: str, param: str = "file_id") -> dict:
    """A file's record whose bytes are still there (404 file_expired or file_deleted once they
    are gone)."""
    row = current_row(store, file_id, param)
    if row["status"] == "expired":
        raise FileExpired(f"file {file_id} expired; its bytes are gone", param=param)
    if row["status"] == "deleted":
        raise FileDeleted(f"file {file_id} was deleted", param=param)
    return row


def file_object(row: dict) -> FileObject:
    """A stored record as the API shows it."""
    return FileObject(
        id=row["id"],
        bytes=row["bytes"],
        created_at=int(row["created_at"]),
        expires_at=row["expires_at"],
        filename=row["filename"],
        purpose=row["purpose"],
        status=row["status"],
    )


class Files:
    """The files routes' one way in."""

    def __init__(self, state: FileParts):
        self.state = state

    def upload(
        self, source: BinaryIO | None, filename: str | None, purpose: str | None
    ) -> FileObject:
        """Store an uploaded file for a batch (400 for another purpose or no file part; 400
        batch_file_limit past the caps, with the measured size, storing nothing)."""
        if purpose not in PURPOSES:
            raise InvalidBatchRequest(
                f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}", param="purpose"
            )
        if source is None:
            raise InvalidBatchRequest("the multipart body has no `file` part", param="file")
        settings = self.state.settings
        now = time.time()
        record = {
            "id": new_file_id(),
            "filename": (filename or DEFAULT_FILENAME)[:MAX_FILENAME],
            "purpose": purpose,
            "status": "processed",
            "created_at": now,
            "expires_at": int(now) + settings.batch_file_retention_days * DAY_S,
        }
        caps = Caps(settings.batch_max_file_bytes, settings.batch_max_rows)
        try:
            measured = store_file(self.state.store, record, source, caps)
        except OverCap as over:
            setting = (
                "MILLM_BATCH_MAX_FILE_BYTES" if over.limit == "bytes" else "MILLM_BATCH_MAX_ROWS"
            )
            raise BatchFileLimit(
                f"the file holds {over.measured} {over.limit}; the most is {over.most} "
                f"({setting}): split it into several files (nothing was stored)",
                param="file",
            ) from None
        return file_object({**record, "bytes": measured.bytes})

    def listed(self, purpose: str | None, after: str | None, limit: int, order: str) -> FileList:
        """A page of files, newest first unless `order` is asc."""
        rows = file_rows(self.state.store, purpose, after, limit + 1, order != "asc")
        page = [file_object(aged(self.state.store, row)) for row in rows[:limit]]
        return FileList(
            data=page,
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
            has_more=len(rows) > limit,
        )

    def get(self, file_id: str) -> FileObject:
        """A file's record (404 file_not_found)."""
        return file_object(current_row(self.state.store, file_id))

    def content(self, file_id: str) -> tuple[Iterator[bytes], int]:
        """A file's bytes, chunk by chunk, and how many (404 file_expired or file_deleted once
        they are gone)."""
        row = readable_row(self.state.store, file_id)
        return file_bytes(self.state.store, file_id), row["bytes"]

    def delete(self, file_id: str) -> FileDeletedBody:
        """Drop a file's bytes and mark it deleted (404 once it already is)."""
        row = current_row(self.state.store, file_id)
        if row["status"] != "processed":
            raise FileDeleted(f"file {file_id} is already {row['status']}", param="file_id")
        if (batch := file_in_use(self.state.store, file_id)) is not None:
            raise FileInUse(f"batch {batch} reads file {file_id}; cancel it first", param="file_id")
        drop_bytes(self.state.store, file_id, "deleted")
        return FileDeletedBody(id=file_id)
