"""/v1/batches: create a batch over a stored file (checked at once: the file, the endpoint, the
window), read, list and cancel batches; the runner (runner.py) does the rest.

Blocking (the store): the routes are plain functions, which FastAPI runs on its worker pool.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from millm.errors import (
    BatchNotFound,
    BatchStateConflict,
    InvalidBatchRequest,
    ModelLeased,
)
from millm.kernel.model.leases import HEADER as LEASE_HEADER
from millm.kernel.model.leases import iso, presented
from millm.store.batches import batch_row, batch_rows, insert_batch, update_batch
from millm.v1.batches.leasing import OWN_HOLDER
from millm.v1.batches.lines import ENDPOINTS, LineServer
from millm.v1.batches.parts import BatchParts
from millm.v1.batches.protocol import MAX_OUTPUT_S, BatchList, BatchObject, CreateBatch
from millm.v1.batches.runner import BatchRunner
from millm.v1.batches.status import stamp
from millm.v1.files.service import readable_row
from millm.v1.objects import hex_id
from millm.v1.serving.serving import Serving

WINDOW = re.compile(r"^([1-9][0-9]*)h$")
OPENAI_WINDOW = "24h"
CANCELLABLE = ("validating", "in_progress")


def new_batch_id() -> str:
    """`batch_` and 24 hex digits."""
    return hex_id("batch_")


class Batches:
    """The batches routes' one way in, and the runner that drains them."""

    def __init__(
        self, state: BatchParts, serving: Serving, servers: Mapping[str, LineServer] | None = None
    ):
        self.state = state
        self.runner = BatchRunner(state, serving, servers)
        # the endpoints a batch may name: /v1's, then the routes beyond it whose lines run
        self.endpoints = (*ENDPOINTS, *self.runner.servers)

    def create(self, body: CreateBatch) -> BatchObject:
        """A batch in `validating`, its lines checked by the runner (400/404 here for the file,
        the endpoint and the window)."""
        self._input(body.input_file_id)
        if body.endpoint not in self.endpoints:
            raise InvalidBatchRequest(
                f"endpoint {body.endpoint!r} is not batched here; use one of "
                f"{', '.join(self.endpoints)}",
                param="endpoint",
            )
        most = self.state.settings.batch_max_completion_window_hours
        window = WINDOW.match(body.completion_window)
        if window is None or not 1 <= int(window.group(1)) <= most:
            raise InvalidBatchRequest(
                f"completion_window is a number of hours, 1h to {most}h "
                f"(MILLM_BATCH_MAX_COMPLETION_WINDOW_HOURS), got {body.completion_window!r}",
                param="completion_window",
            )
        token = self._caller_lease()
        now = time.time()
        keep = body.output_expires_after.seconds if body.output_expires_after else MAX_OUTPUT_S
        batch = {
            "id": new_batch_id(),
            "object": "batch",
            "endpoint": body.endpoint,
            "model": None,
            "errors": None,
            "input_file_id": body.input_file_id,
            "completion_window": body.completion_window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "expires_at": int(now) + int(window.group(1)) * 3600,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.metadata,
            "millm": {
                "pack": self.state.settings.batch_pack_default if body.pack is None else body.pack,
                "waiting_reason": None,
                "lease_mode": "caller" if token else None,
                "completion_window_extension": body.completion_window != OPENAI_WINDOW,
                "output_expires_after": keep,
            },
        }
        insert_batch(self.state.store, batch)
        if token:
            self.runner.leasing.adopt(str(batch["id"]), token, self.state.switch.resident)
        self.runner.wake.set()
        return view(batch)

    def lease(self, batch_id: str) -> BatchObject:
        """Run a batch under the caller's lease (X-miLLM-Lease) from now on; the batch renews it
        and never releases it."""
        token = presented.get()
        if not token:
            raise InvalidBatchRequest(
                f"send the id of your lease on the loaded model in {LEASE_HEADER}",
                param=LEASE_HEADER,
            )
        status = self._batch(batch_id)["status"]
        if status not in CANCELLABLE:
            raise BatchStateConflict(
                f"batch {batch_id} is {status}: only a batch still to run takes a lease",
                param="batch_id",
            )
        self.runner.leasing.adopt(batch_id, token, self.state.switch.resident)

        def under_it(stored: dict) -> dict:
            return {**stored, "millm": {**stored["millm"], "lease_mode": "caller"}}

        batch = update_batch(self.state.store, batch_id, under_it)
        assert batch is not None  # read above; batches are never deleted
        self.runner.wake.set()
        return view(batch)

    def _caller_lease(self) -> str | None:
        """The lease id the request sent, checked live (404/409 otherwise); 409 model_leased when
        none is sent while a client's lease lives (another batch's own lease is waited for)."""
        switch = self.state.switch
        token = presented.get()
        if token:
            switch.leases.held_by(token, switch.resident)
            return token
        lease = switch.leases.live(switch.resident)
        if lease is not None and not lease.holder.startswith(OWN_HOLDER):
            raise ModelLeased(
                f"model {lease.model!r} is leased by {lease.holder!r} until "
                f"{iso(lease.expires_at)} ({lease.reason}): a batch would wait for it. Send the "
                f"lease's id in {LEASE_HEADER} to run the batch under it",
                param="model",
            )
        return None

    def get(self, batch_id: str) -> BatchObject:
        """A batch, its counts current to its last recorded chunk (404 batch_not_found)."""
        return view(self._batch(batch_id))

    def listed(self, after: str | None, limit: int) -> BatchList:
        """A page of batches, newest first."""
        rows = batch_rows(self.state.store, after, limit + 1)
        page = [view(row) for row in rows[:limit]]
        return BatchList(
            data=page,
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
            has_more=len(rows) > limit,
        )

    def cancel(self, batch_id: str) -> BatchObject:
        """Move a batch to `cancelling` (again: no change); 409 once it ended."""

        def cancelled(stored: dict) -> dict:
            return stamp(stored, "cancelling") if stored["status"] in CANCELLABLE else stored

        batch = update_batch(self.state.store, batch_id, cancelled)
        if batch is None:
            raise BatchNotFound(f"no batch {batch_id!r}", param="batch_id")
        if batch["status"] != "cancelling":
            raise BatchStateConflict(
                f"batch {batch_id} is {batch['status']}: it can no longer be cancelled",
                param="batch_id",
            )
        self.runner.wake.set()
        return view(batch)

    def _batch(self, batch_id: str) -> dict:
        batch = batch_row(self.state.store, batch_id)
        if batch is None:
            raise BatchNotFound(f"no batch {batch_id!r}", param="batch_id")
        return batch

    def _input(self, file_id: str) -> None:
        row = readable_row(self.state.store, file_id, param="input_file_id")
        if row["purpose"] != "batch":
            raise InvalidBatchRequest(
                f"file {file_id} has purpose {row['purpose']!r}; a batch reads a file uploaded "
                'with purpose "batch"',
                param="input_file_id",
            )


def view(batch: dict) -> BatchObject:
    """A stored batch as the API shows it."""
    return BatchObject.model_validate({**batch, "created_at": int(batch["created_at"])})
