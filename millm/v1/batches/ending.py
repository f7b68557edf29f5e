"""A batch's end: its output and error files written (every line once, in line order; a line
that never ran says why), then the batch ended, its recorded results dropped (its files hold
them). Its pending lines are dropped first, so from then on no replica records a line of it.
"""

from __future__ import annotations

import io
import json
import logging
import time

from millm.store.batch_files import Caps, store_file
from millm.store.batches import batch_row, drop_pending, finish, recorded
from millm.store.database import Store
from millm.v1.batches.lines import Line, error_line
from millm.v1.batches.status import stamp
from millm.v1.files.service import new_file_id

log = logging.getLogger(__name__)
UNRUN = {"cancelled": "batch_cancelled", "expired": "batch_expired", "failed": "batch_failed"}


def end_batch(
    store: Store,
    batch_id: str,
    status: str,
    failure: tuple[str, str] | None,
    valid: list[Line],
) -> None:
    """End the batch as `status` (`failure`: the code and message it failed with), its files
    written; `valid` are its lines that could run (what an unrun line's error line names)."""
    drop_pending(store, batch_id)
    batch = batch_row(store, batch_id)
    assert batch is not None  # batches are never deleted
    if failure is not None:
        listed = (batch.get("errors") or {"object": "list", "data": []})["data"]
        code, message = failure
        ended = {"code": code, "line": None, "message": message, "param": None}
        batch = {**batch, "errors": {"object": "list", "data": [*listed, ended]}}
    results = recorded(store, batch_id)
    lines = {line.number: line for line in valid}
    output, errors = io.BytesIO(), io.BytesIO()
    unrun = 0
    for number in range(1, batch["request_counts"]["total"] + 1):
        if number in results:
            ok, record = results[number]
        else:
            ok, unrun = False, unrun + 1
            known = lines.get(number)
            record = error_line(
                number,
                known.custom_id if known else None,
                UNRUN.get(status, "batch_failed"),
                f"not run: the batch was {status}",
            )
        (output if ok else errors).write(json_line(record).encode())
    counts = {**batch["request_counts"]}
    counts["failed"] += unrun
    batch = {**batch, "request_counts": counts}
    batch["output_file_id"] = _store_output(store, batch, output.getvalue(), "output")
    batch["error_file_id"] = _store_output(store, batch, errors.getvalue(), "error")
    finish(store, stamp(batch, status) if batch["status"] != status else batch)
    log.info("batch %s %s: %s", batch_id, status, counts)


def _store_output(store: Store, batch: dict, data: bytes, kind: str) -> str | None:
    if not data:
        return None  # OpenAI's batches leave a file with no line unmade (its id null)
    file_id = new_file_id()
    record = {
        "id": file_id,
        "filename": f"{batch['id']}_{kind}.jsonl",
        "purpose": "batch_output",
        "status": "processed",
        "created_at": time.time(),
        "expires_at": int(batch["created_at"]) + batch["millm"]["output_expires_after"],
    }
    store_file(store, record, io.BytesIO(data), Caps(2**62, 2**62))
    return file_id


def json_line(record: dict) -> str:
    """A record as one compact JSONL line."""
    return json.dumps(record, separators=(",", ":")) + "\n"
