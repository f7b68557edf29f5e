"""The Batch API from a client's side: a JSONL input file, waiting for a batch to end, and an
output or error file's lines."""

from __future__ import annotations

import json
import time


def jsonl(entries: list) -> bytes:
    """Entries (objects, or raw strings for lines that are not JSON) as a JSONL file."""
    return "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in entries).encode()


def wait(client, batch_id: str, until=("completed", "failed", "cancelled", "expired"), limit=120):
    """The batch once its status is one of `until` (an assertion error past `limit` seconds)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def lines_of(client, file_id: str | None) -> list[dict]:
    """An output or error file's lines (none when there is no file)."""
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).content.splitlines()]
