"""The batch runner: one task per process that validates batches, drains them a chunk at a time
through the synchronous routes' own serving code, and ends them (ending.py writes their files).

A chunk's lines run together (the scheduler batches them as it batches any requests), as
background jobs: they enter the scheduler's queue one at a time and only while no interactive
request waits, so a chat waits behind one batch line at most; a refusal that means "not now"
(model_busy) is a wait, never a line's answer. A batch never loads a model: while its model is
not the loaded one it waits (`waiting_reason: model_not_resident`) until its window ends, and no
line runs without a lease on the model (leasing.py). Every replica on the database drains a
batch, each claiming a chunk of its pending lines at a time (store/batches.py); a chunk's results
commit with the counts in one transaction, so after a crash the batch resumes from its first
unrecorded line and nothing recorded runs twice. Validating and ending a batch are its
claimant's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from anyio import to_thread

from millm.engine.jobs import pack_scoring
from millm.engine.scheduler import background
from millm.engine.scoring import PACK_ROWS
from millm.errors import MillmError, ModelBusy, QueueFull, ServerShuttingDown
from millm.kernel.monitoring.requests import BatchLine, batch_line
from millm.store.batch_files import expire_files, file_bytes
from millm.store.batches import (
    batch_row,
    claim,
    claim_lines,
    hold_lines,
    live_batches,
    queue_state,
    queue_unrecorded,
    record_lines,
    release_lines,
    update_batch,
    validated,
)
from millm.store.changes import Topic
from millm.v1.batches.ending import end_batch
from millm.v1.batches.leasing import BatchLeases
from millm.v1.batches.lines import (
    Line,
    LineServer,
    error_line,
    line_id,
    read_lines,
    request_id,
)
from millm.v1.batches.parts import BatchParts
from millm.v1.batches.status import finalizing, stamp
from millm.v1.http.errors import error_body
from millm.v1.serving.http_replies import report_headers
from millm.v1.serving.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from millm.v1.serving.serving import Serving

log = logging.getLogger(__name__)
POLL_S = 1.0  # how often a waiting batch looks again (a new batch or a cancel wakes it at once)
WAITS = (QueueFull, ModelBusy, ServerShuttingDown)  # "not now": the line runs later
SWEEP_S = 3600.0  # how often files past their retention are expired (reads expire them too)
SHOWN_ERRORS = 100  # validation errors the batch object lists (the error file has every one)


class BatchRunner:
    """Drains every live batch of the store, oldest first, a chunk at a time."""

    def __init__(
        self, state: BatchParts, serving: Serving, servers: Mapping[str, LineServer] | None = None
    ):
        self.state, self.serving = state, serving
        self.servers = dict(servers or {})  # routes beyond /v1 whose lines run (probe scoring)
        self.wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._lines: dict[str, list[Line]] = {}  # each running batch's valid lines
        self._claims: dict[str, tuple[bool, float]] = {}  # claimant or not, asked when
        self.leasing = BatchLeases(state.switch.leases, state.settings.batch_lease_ttl_seconds)

    def start(self) -> None:
        """Run in the background (the server's lifespan), woken by other replicas' batches too."""
        loop = asyncio.get_running_loop()

        def woken() -> None:  # the listener's thread
            loop.call_soon_threadsafe(self.wake.set)

        self.state.replication.on(Topic.BATCHES, woken)
        self._task = loop.create_task(self._run(), name="millm-batches")

    async def stop(self) -> None:
        """Stop between chunks (a chunk cut short is recorded by none: it runs again)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.leasing.keep_only(set(), self.state.switch.resident)  # a model left leased blocks

    async def _run(self) -> None:
        next_sweep = 0.0
        while True:
            try:
                if time.monotonic() >= next_sweep:  # at start, then every SWEEP_S
                    next_sweep = time.monotonic() + SWEEP_S
                    expired = await to_thread.run_sync(expire_files, self.state.store)
                    if expired:
                        log.info("%d batch files expired (their bytes dropped)", len(expired))
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
        """One move of each live batch; whether anything moved. Any replica runs a chunk of any
        batch in progress; the rest (validating, ending) is the batch's claimant's."""
        moved = False
        hold = self.state.settings.batch_claim_seconds
        running = set()
        live = await to_thread.run_sync(live_batches, self.state.store)
        for gone in (self._lines.keys() | self._claims.keys()) - {b["id"] for b in live}:
            self._lines.pop(gone, None)  # ended, by this replica or another
            self._claims.pop(gone, None)
        for batch in live:
            mine = await self._claimant(batch["id"], hold)
            if batch["status"] in ("validating", "in_progress"):  # a caller's lease stays
                running.add(batch["id"])
            if batch["status"] == "in_progress" and batch["millm"].get("queued"):
                if mine and time.time() >= batch["expires_at"]:
                    await to_thread.run_sync(self._end, batch["id"], "expired")
                    moved = True
                else:
                    moved = await self._chunk(batch) or moved
            elif mine:
                await to_thread.run_sync(self._advance, batch)
                moved = True
        for batch_id in self.leasing.batches() - running:  # made after the list was read?
            row = await to_thread.run_sync(batch_row, self.state.store, batch_id)
            if row is not None and row["status"] in ("validating", "in_progress"):
                running.add(batch_id)
        self.leasing.keep_only(running, self.state.switch.resident)
        return moved

    async def _claimant(self, batch_id: str, hold: float) -> bool:
        """Whether this replica is the batch's claimant, asked of the store a few times per claim
        period (not at every chunk: each ask is a write other replicas' chunks would wait on)."""
        asked = self._claims.get(batch_id)
        if asked is not None and time.monotonic() - asked[1] < hold / 3:
            return asked[0]
        store = self.state.store
        mine = await to_thread.run_sync(claim, store, batch_id, store.origin, hold)
        self._claims[batch_id] = (mine, time.monotonic())
        return mine

    def _advance(self, batch: dict) -> None:
        status = batch["status"]
        if status == "validating":
            self._validate(batch)
        elif status == "in_progress":  # validated before lines were queued: queue the rest
            numbers = [line.number for line in self._read(batch)]
            queue_unrecorded(self.state.store, batch["id"], numbers)
        else:
            self._end(batch["id"], {"cancelling": "cancelled", "finalizing": "completed"}[status])

    def _read(self, batch: dict) -> list[Line]:
        """The batch's valid lines, read from its file once per replica."""
        lines = self._lines.get(batch["id"])
        if lines is None:
            data = b"".join(file_bytes(self.state.store, batch["input_file_id"]))
            lines = read_lines(data, batch["endpoint"], self.servers)[0]
            self._lines[batch["id"]] = lines
        return lines

    # validation -----------------------------------------------------------------------------------
    def _validate(self, batch: dict) -> None:
        store = self.state.store
        data = b"".join(file_bytes(store, batch["input_file_id"]))
        valid, errors = read_lines(data, batch["endpoint"], self.servers)
        valid, errors = self._on_resident(valid, errors)
        self._lines[batch["id"]] = valid  # what an error line says of a line that never ran
        counts = {"total": len(valid) + len(errors), "completed": 0, "failed": len(errors)}
        shown = None
        if errors:
            shown = {
                "object": "list",
                "data": [
                    {
                        "code": e["error"]["code"],
                        "line": e["line"],
                        "message": e["error"]["message"],
                        "param": None,
                    }  # fmt: skip
                    for e in errors[:SHOWN_ERRORS]
                ],
            }
        resident = self.state.switch.resident or ""  # lines naming no model run on it
        models = sorted({line.model or resident for line in valid})
        failure = None
        if not valid:
            failure = ("empty_file" if not errors else "no_valid_lines",
                       "the file has no line that can run")  # fmt: skip
        elif len(models) > 1:
            counts_by = {
                m: sum(1 for line in valid if (line.model or resident) == m) for m in models
            }
            listed = ", ".join(f"{m} ({n} lines)" for m, n in counts_by.items())
            failure = ("multiple_models", f"a batch runs one model; its lines name {listed}")

        def checked(stored: dict) -> dict:
            stored = {**stored, "request_counts": counts, "errors": shown}
            if failure is not None or stored["status"] != "validating":  # failed, or cancelled
                return stored
            moved = stamp({**stored, "model": models[0]}, "in_progress")
            moved["millm"] = {**moved["millm"], "waiting_reason": "queued", "queued": True}
            return moved

        queued = [] if failure is not None else [line.number for line in valid]
        refused = [(e["line"], e) for e in errors]
        validated(store, batch["id"], refused, queued, checked)
        if failure is not None:
            self._end(batch["id"], "failed", failure)

    def _on_resident(self, valid: list[Line], errors: list[dict]) -> tuple[list[Line], list[dict]]:
        """Lines that name no model run on the resident one: with none loaded, each is refused
        (model_not_loaded), in line order among the other error lines."""
        if self.state.switch.resident is not None or all(line.model for line in valid):
            return valid, errors
        refused = [
            error_line(
                line.number,
                line.custom_id,
                "model_not_loaded",
                "no model is loaded, and this endpoint's lines score with the loaded model",
            )
            for line in valid
            if line.model is None
        ]
        kept = [line for line in valid if line.model is not None]
        return kept, sorted(errors + refused, key=lambda e: e["line"])

    # running --------------------------------------------------------------------------------------
    async def _chunk(self, batch: dict) -> bool:
        store, origin, batch_id = self.state.store, self.state.store.origin, batch["id"]
        lines = {line.number: line for line in await to_thread.run_sync(self._read, batch)}
        base = self.state.variants.named(batch["model"]).base
        resident = self.state.switch.resident
        if resident != base:
            # Another replica with the model may be draining it: only a batch nobody runs waits.
            _, elsewhere = await to_thread.run_sync(queue_state, store, batch_id, origin)
            if not elsewhere:
                await self._note(batch, "model_not_resident")
            return False
        if (waiting := self.leasing.ensure(batch_id, base, resident)) is not None:
            await self._note(batch, waiting)  # no line runs without a lease
            return False
        if (scheduler := self.state.switch.scheduler) is not None and scheduler.queue_depth:
            return False  # an interactive request waits: it goes first
        hold = self.state.settings.batch_claim_seconds
        most = self.state.settings.batch_chunk_rows
        pack = batch["millm"]["pack"]
        if pack:  # a packed pass holds up to PACK_ROWS lines
            most = max(most, PACK_ROWS)
        server = self.servers.get(batch["endpoint"])
        if server is not None:  # one line at a time, one input per forward pass, whatever `pack`
            most = 1
        numbers = await to_thread.run_sync(claim_lines, store, batch_id, origin, most, hold)
        if not numbers:
            left, _ = await to_thread.run_sync(queue_state, store, batch_id, origin)
            if left:
                return False  # other replicas hold the rest
            await to_thread.run_sync(update_batch, store, batch_id, finalizing)
            return True
        await self._note(batch, None)
        holding = asyncio.get_running_loop().create_task(self._hold(batch_id, numbers))
        try:
            answers = await asyncio.gather(
                *(self._serve(batch_id, lines[n], pack, server) for n in numbers)
            )
        finally:
            holding.cancel()
        kept = [answer for answer in answers if answer is not None]
        ran = {number for number, _, _ in kept}
        unrun = [n for n in numbers if n not in ran]
        await to_thread.run_sync(release_lines, store, batch_id, origin, unrun)
        if kept:
            await to_thread.run_sync(record_lines, store, batch_id, origin, kept)
        return bool(kept)

    async def _hold(self, batch_id: str, numbers: list[int]) -> None:
        """Renew the claim on a running chunk's lines a few times per claim period."""
        hold = self.state.settings.batch_claim_seconds
        while True:
            await asyncio.sleep(hold / 3)
            store = self.state.store
            await to_thread.run_sync(hold_lines, store, batch_id, store.origin, numbers, hold)

    async def _note(self, batch: dict, reason: str | None) -> None:
        """Say why the batch waits (None: it runs) and whose lease it runs under, writing only a
        change."""
        said_now = {"waiting_reason": reason, "lease_mode": self.leasing.mode(batch["id"])}
        if all(batch["millm"].get(key) == value for key, value in said_now.items()):
            return

        def said(stored: dict) -> dict:
            if stored["status"] != "in_progress":
                return stored
            return {**stored, "millm": {**stored["millm"], **said_now}}

        await to_thread.run_sync(update_batch, self.state.store, batch["id"], said)

    async def _serve(
        self, batch_id: str, line: Line, pack: bool, server: LineServer | None = None
    ) -> tuple[int, bool, dict] | None:
        """One line through the synchronous route's serving code (`server`'s, for a route beyond
        /v1): its output line, its error line, or None for a refusal that means "not now"."""
        body = line.body
        asked = request_id()
        # this line's task only: its jobs wait behind interactive ones, its monitoring records
        # name it and stay off the live feed
        background.set(True)
        pack_scoring.set(pack)
        batch_line.set(BatchLine(batch_id, line.number, line.custom_id))
        try:
            with self.state.switch.request_scope():
                if server is not None:
                    answer = await server.answer(body)
                elif isinstance(body, ChatCompletionRequest):
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
        if server is not None:  # a route beyond /v1 sends no X-miLLM-* headers
            dumped, headers = answer.model_dump(), {}
        else:
            assert reply.body is not None  # a batch line never streams
            dumped = reply.body.model_dump()
            cap = self.state.settings.ignored_fields_header_max_bytes
            headers = report_headers(reply.report, cap)
        return (
            line.number,
            True,
            {
                "id": line_id(),
                "custom_id": line.custom_id,
                "response": {
                    "status_code": 200,
                    "request_id": asked,
                    "body": dumped,
                    "millm": {
                        "packed": packed_line(body, pack),
                        "headers": headers,
                        "replica_id": self.state.store.origin,  # who ran it (replicas share)
                    },
                },
                "error": None,
            },
        )

    # the end --------------------------------------------------------------------------------------
    def _end(self, batch_id: str, status: str, failure: tuple[str, str] | None = None) -> None:
        """End the batch as `status` with its files written (ending.py)."""
        batch = batch_row(self.state.store, batch_id)
        assert batch is not None  # batches are never deleted
        end_batch(self.state.store, batch_id, status, failure, self._read(batch))
        self._lines.pop(batch_id, None)
        self._claims.pop(batch_id, None)


def packed_line(body: object, pack: bool) -> bool:
    """Whether a line's pass may have been shared (`millm.packed`): packing on, and the line
    plain next-token scoring (no reads, no echo), as the engine packs."""
    if not pack or not isinstance(body, (ChatCompletionRequest, CompletionRequest)):
        return False
    echo = isinstance(body, CompletionRequest) and body.echo
    return body.scoring and body.return_sae_activations is None and not echo
