"""The batch runner: one task per process that validates batches, drains them a chunk at a time
through the synchronous routes' own serving code, and writes their output and error files.

A chunk's lines run together (the scheduler batches them as it batches any requests), as
background jobs: they enter the scheduler's queue one at a time and only while no interactive
request waits, so a chat waits behind one batch line at most; a refusal that means "not now"
(model_busy) is a wait, never a line's answer. A batch never loads a
model: while its model is not the loaded one it waits (`waiting_reason: model_not_resident`)
until its window ends. Each chunk's results commit with the counts in one transaction, so after a
crash the batch resumes from its first unrecorded line and nothing recorded runs twice. One
replica drains a batch at a time (store/batches.py's claim).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import time

from anyio import to_thread

from millm.engine.scheduler import background
from millm.errors import MillmError, ModelBusy, QueueFull, ServerShuttingDown
from millm.store.batch_files import Caps, file_bytes, store_file
from millm.store.batches import (
    claim,
    finish,
    forget_results,
    live_batches,
    record_chunk,
    recorded,
    save_batch,
)
from millm.v1.batches.lines import Line, error_line, line_id, read_lines, request_id
from millm.v1.batches.parts import BatchParts
from millm.v1.files.service import new_file_id
from millm.v1.http.errors import error_body
from millm.v1.serving.http_replies import report_headers
from millm.v1.serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from millm.v1.serving.serving import Serving

log = logging.getLogger(__name__)
POLL_S = 1.0  # how often a waiting batch looks again (a new batch or a cancel wakes it at once)
WAITS = (QueueFull, ModelBusy, ServerShuttingDown)  # "not now": the line runs later
SHOWN_ERRORS = 100  # validation errors the batch object lists (the error file has every one)
UNRUN = {"cancelled": "batch_cancelled", "expired": "batch_expired", "failed": "batch_failed"}


def stamp(batch: dict, status: str) -> dict:
    """The batch moved to `status`, its `<status>_at` stamped (a waiting_reason only while it
    runs)."""
    moved = {**batch, "status": status, f"{status}_at": int(time.time())}
    if status != "in_progress":
        moved["millm"] = {**moved["millm"], "waiting_reason": None}
    return moved


class BatchRunner:
    """Drains every live batch of the store, oldest first, a chunk at a time."""

    def __init__(self, state: BatchParts, serving: Serving):
        self.state, self.serving = state, serving
        self.wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._lines: dict[str, list[Line]] = {}  # each running batch's valid lines
        self._done: dict[str, set[int]] = {}  # and the lines recorded so far

    def start(self) -> None:
        """Run in the background (the server's lifespan)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="millm-batches")

    async def stop(self) -> None:
        """Stop between chunks (a chunk cut short is recorded by none: it runs again)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                progressed = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end batch processing for good
                log.exception("batch runner step failed")
                progressed = False
            if not progressed:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), POLL_S)

    async def step(self) -> bool:
        """One move of each live batch this replica holds; whether anything moved."""
        moved = False
        origin = self.state.store.origin
        for batch in await to_thread.run_sync(live_batches, self.state.store):
            if not await to_thread.run_sync(claim, self.state.store, batch["id"], origin):
                continue
            moved = await self._advance(batch) or moved
        return moved

    async def _advance(self, batch: dict) -> bool:
        status = batch["status"]
        if status == "validating":
            await to_thread.run_sync(self._validate, batch)
            return True
        if status == "cancelling":
            await to_thread.run_sync(self._end, batch, "cancelled")
            return True
        if status == "finalizing":
            await to_thread.run_sync(self._end, batch, "completed")
            return True
        if time.time() >= batch["expires_at"]:
            await to_thread.run_sync(self._end, stamp(batch, "expired"), "expired")
            return True
        return await self._chunk(batch)

    # validation -----------------------------------------------------------------------------------
    def _validate(self, batch: dict) -> None:
        store = self.state.store
        forget_results(store, batch["id"])  # a validation cut short by a restart starts again
        data = b"".join(file_bytes(store, batch["input_file_id"]))
        valid, errors = read_lines(data, batch["endpoint"])
        self._lines[batch["id"]] = valid  # what an error line says of a line that never ran
        counts = {"total": len(valid) + len(errors), "completed": 0, "failed": len(errors)}
        batch = {**batch, "request_counts": counts}
        if errors:
            batch["errors"] = {
                "object": "list",
                "data": [
                    {
                        "code": e["error"]["code"],
                        "line": e["line"],
                        "message": e["error"]["message"],
                        "param": None,
                    }  # fmt: skip
                    for e in errors[:100]
                ],
            }
        models = sorted({line.model for line in valid})
        record_chunk(store, batch, [(e["line"], False, e) for e in errors])
        if not valid:
            reason = "empty_file" if not errors else "no_valid_lines"
            self._fail(batch, reason, "the file has no line that can run")
            return
        if len(models) > 1:
            counts_by = {m: sum(1 for line in valid if line.model == m) for m in models}
            listed = ", ".join(f"{m} ({n} lines)" for m, n in counts_by.items())
            self._fail(batch, "multiple_models", f"a batch runs one model; its lines name {listed}")
            return
        batch = stamp({**batch, "model": models[0]}, "in_progress")
        batch["millm"] = {**batch["millm"], "waiting_reason": "queued"}
        save_batch(store, batch)
        self._done[batch["id"]] = set()

    def _fail(self, batch: dict, code: str, message: str) -> None:
        listed = (batch.get("errors") or {"object": "list", "data": []})["data"]
        failure = {"code": code, "line": None, "message": message, "param": None}
        batch = {**batch, "errors": {"object": "list", "data": [*listed, failure]}}
        self._end(stamp(batch, "failed"), "failed")

    # running --------------------------------------------------------------------------------------
    async def _chunk(self, batch: dict) -> bool:
        lines = self._lines.get(batch["id"])
        if lines is None:  # after a restart: read the file and what was recorded once
            data = await to_thread.run_sync(
                lambda: b"".join(file_bytes(self.state.store, batch["input_file_id"]))
            )
            lines = self._lines[batch["id"]] = read_lines(data, batch["endpoint"])[0]
            done = await to_thread.run_sync(recorded, self.state.store, batch["id"])
            self._done[batch["id"]] = set(done)
        done_lines = self._done[batch["id"]]
        pending = [line for line in lines if line.number not in done_lines]
        if not pending:
            await to_thread.run_sync(save_batch, self.state.store, stamp(batch, "finalizing"))
            return True
        base = self.state.variants.named(batch["model"]).base
        waiting = None
        if self.state.switch.resident != base:
            waiting = "model_not_resident"
        elif (scheduler := self.state.switch.scheduler) is not None and scheduler.queue_depth:
            return False  # an interactive request waits: it goes first
        if waiting != batch["millm"]["waiting_reason"]:
            batch = {**batch, "millm": {**batch["millm"], "waiting_reason": waiting}}
            await to_thread.run_sync(save_batch, self.state.store, batch)
        if waiting is not None:
            return False
        chunk = pending[: self.state.settings.batch_chunk_rows]
        answers = await asyncio.gather(*(self._serve(batch, line) for line in chunk))
        kept = [answer for answer in answers if answer is not None]
        if not kept:
            return False
        counts = dict(batch["request_counts"])
        counts["completed"] += sum(1 for _, ok, _ in kept if ok)
        counts["failed"] += sum(1 for _, ok, _ in kept if not ok)
        # A cancel that landed while the chunk ran stays (record_chunk keeps it): the chunk is
        # recorded all the same.
        updated = {**batch, "request_counts": counts}
        await to_thread.run_sync(record_chunk, self.state.store, updated, kept)
        done_lines.update(number for number, _, _ in kept)
        return True

    async def _serve(self, batch: dict, line: Line) -> tuple[int, bool, dict] | None:
        """One line through the synchronous route's serving code: its output line, its error line,
        or None for a refusal that means "not now"."""
        body = line.body
        asked = request_id()
        background.set(True)  # this line's task only: its jobs wait behind interactive ones
        try:
            with self.state.switch.request_scope():
                if isinstance(body, ChatCompletionRequest):
                    reply = await self.serving.chat(body, True, request_id=asked, may_load=False)
                elif isinstance(body, CompletionRequest):
                    reply = await self.serving.complete(body, True, False)
                else:
                    assert isinstance(body, EmbeddingRequest)
                    reply = await self.serving.embed(body, True, False)
        except WAITS:
            return None
        except MillmError as error:
            response = {"status_code": error.status, "request_id": asked, "body": error_body(error)}
            return (
                line.number,
                False,
                {
                    "id": line_id(),
                    "custom_id": line.custom_id,
                    "line": line.number,
                    "response": response,
                    "error": {"code": error.code, "message": error.message},
                },
            )
        assert reply.body is not None  # a batch line never streams
        headers = report_headers(reply.report, self.state.settings.ignored_fields_header_max_bytes)
        return (
            line.number,
            True,
            {
                "id": line_id(),
                "custom_id": line.custom_id,
                "response": {
                    "status_code": 200,
                    "request_id": asked,
                    "body": reply.body.model_dump(),
                    "millm": {"packed": False, "headers": headers},
                },
                "error": None,
            },
        )

    # the end --------------------------------------------------------------------------------------
    def _end(self, batch: dict, status: str) -> None:
        """Write the output and error files (every line once, in line order; a line that never ran
        says why), then end the batch as `status`."""
        store = self.state.store
        results = recorded(store, batch["id"])
        lines = {line.number: line for line in self._lines.get(batch["id"], [])}
        total = batch["request_counts"]["total"]
        output, errors = io.BytesIO(), io.BytesIO()
        unrun = 0
        for number in range(1, total + 1):
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
            (output if ok else errors).write((json_line(record)).encode())
        counts = {**batch["request_counts"]}
        counts["failed"] += unrun
        batch = {**batch, "request_counts": counts}
        batch["output_file_id"] = self._store_output(batch, output.getvalue(), "output")
        batch["error_file_id"] = self._store_output(batch, errors.getvalue(), "error")
        ended = stamp(batch, status) if batch["status"] != status else batch
        finish(store, ended)
        self._lines.pop(batch["id"], None)
        self._done.pop(batch["id"], None)
        log.info("batch %s %s: %s", batch["id"], status, counts)

    def _store_output(self, batch: dict, data: bytes, kind: str) -> str | None:
        if not data:
            return None
        now = time.time()
        file_id = new_file_id()
        record = {
            "id": file_id,
            "filename": f"{batch['id']}_{kind}.jsonl",
            "purpose": "batch_output",
            "status": "processed",
            "created_at": now,
            "expires_at": int(batch["created_at"]) + batch["millm"]["output_expires_after"],
        }
        store_file(self.state.store, record, io.BytesIO(data), Caps(2**62, 2**62))
        return file_id


def json_line(record: dict) -> str:
    """A record as one compact JSONL line."""
    return json.dumps(record, separators=(",", ":")) + "\n"
