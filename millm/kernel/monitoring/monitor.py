"""Live feature monitoring: which SAE and features to watch, per-request records, statistics, a
feed.

The Monitor is the one owner of monitoring state. A monitored generation row carries a
ResidualRead (pre_steering, at the watched SAE's point) whose encode runs on the scheduler
thread when the row finishes (torch work on another live thread slows every decode step);
the encoded capture is handed to the monitor's worker thread, which keeps a record (bounded
history), updates per-feature statistics and pushes the record to every live subscriber. A
record carries the verdicts of the active probes on its row (`probes`), when any watched it. An
unmonitored request carries no read at all. Scoring and embeddings are never monitored.

A record names its request by the id its client got back, and the monitor keeps that request's
prompt while the history can hold a record of it (requests.py). A batch's lines are not live
traffic: their records (`origin: "batch"`, with the batch and line) are kept in a history of
their own, never reach the live feed or the statistics, and keep no prompt. Token text and labels
(`tokens`, `labels`) are added when the record is made, on the worker thread: by the request's
own tokenizer, which may be unloaded by the time the record is read, and from the labels as
they are then.

Monitoring must never block or slow generation, so the hand-over never waits: past WORK_BACKLOG
captures waiting for the worker, a capture is dropped and counted (`queue.dropped` in GET
/api/monitoring, a warning in the log at most every DROP_WARNING_S seconds).

Over 400 lines because the Monitor is one owner: its settings, records, statistics and feed
change under one lock, on its worker thread, and each reading of them needs that lock.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from pydantic import ValidationError

from millm.engine.jobs import ProbeVerdict, ResidualRead, ResidualsRead
from millm.errors import InvalidRequest
from millm.formats.document_fields import validate_field
from millm.interp.calibration_stats import PercentileTable
from millm.interp.probes import verdict_fields
from millm.interp.sae_reads import encode_rows
from millm.interp.steering import Attached, check_feature
from millm.kernel.books.calibrations import add_percentiles, percentiles_block
from millm.kernel.books.labels import labelled
from millm.kernel.monitoring.config import MonitoringConfig
from millm.kernel.monitoring.requests import PROMPT_CHARS, BatchLine, Origin, RequestPrompts
from millm.kernel.runtime.feed import LiveFeed
from millm.store.changes import Topic
from millm.store.database import Store
from millm.store.settings import get_setting, set_setting

log = logging.getLogger(__name__)

SETTING = "monitoring"
SUBSCRIBER_BACKLOG = 1000  # records a slow live client may fall behind before it misses some
WORK_BACKLOG = 1000  # finished rows waiting for the worker before their records are dropped
DROP_WARNING_S = (
    60.0  # at most one "records dropped" warning a minute: a flood must not flood the log
)
CLOSE_TIMEOUT_S = 10.0


def origin_fields(batch: BatchLine | None) -> dict:
    """What a record says of where its request came from: a client (`request`), or a batch's
    line."""
    if batch is None:
        return {"origin": "request"}
    return {
        "origin": "batch",
        "batch_id": batch.batch_id,
        "batch_line": batch.line,
        "custom_id": batch.custom_id,
    }


@dataclass
class FeatureStats:
    """One watched feature over every monitored position since the last reset."""

    active: int = 0
    total: float = 0.0
    peak: float = 0.0

    def add(self, value: float) -> None:
        """Count one position where the feature fired with `value`."""
        self.active += 1
        self.total += value
        self.peak = max(self.peak, value)


@dataclass
class Pending:
    """A finished row's capture waiting for the worker, with what it is to be encoded by."""

    origin: Origin
    at: float
    captured: ResidualsRead
    attached: Attached
    features: tuple[int, ...] | None
    top_k: int
    percentiles: bool = False  # asked for
    table: PercentileTable | None = None  # the SAE's calibration on the model, when there is one
    # the active probes' verdicts on this row (verdict_fields)
    probes: list[dict] = field(default_factory=list)
    tokens: bool = False  # each position's token text asked for
    labels: bool = False  # each entry's feature label asked for

    @property
    def request_id(self) -> str:
        """The request's id, as its client got it."""
        return self.origin.request_id


@dataclass
class Monitor:
    """Monitoring settings (persisted), records, statistics and live subscribers."""

    def __init__(
        self,
        store: Store,
        history: int,
        backlog: int = WORK_BACKLOG,
        *,
        batch_history: int = 10_000,
        labels: Callable[[str], Mapping[int, dict]] = lambda _: {},
        prompt_chars: int = PROMPT_CHARS,
    ):
        self.store = store
        self.config = self._stored()
        self.records: collections.deque[dict] = collections.deque(maxlen=history)
        self.batch_records: collections.deque[dict] = collections.deque(maxlen=batch_history)
        self.prompts = RequestPrompts(history, prompt_chars)
        self.labels = labels  # an SAE's labels (LabelBook.entries): may read the store
        self.stats: dict[int, FeatureStats] = {}
        self.positions_read = 0
        self.requests = 0
        self.dropped = 0  # captures refused by a full work queue since the last reset
        self._record_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._drop_lock = threading.Lock()  # not _lock: the worker holds that while it records
        self._warned_at = -DROP_WARNING_S
        self.feed = LiveFeed(SUBSCRIBER_BACKLOG)
        self._work: queue.Queue[Pending | None] = queue.Queue(maxsize=backlog)
        self.worker = threading.Thread(target=self._run, name="millm-monitor", daemon=True)
        self.worker.start()

    # settings ------------------------------------------------------------------------------------
    def _stored(self) -> dict:
        """The stored settings; the defaults when none are stored or they no longer validate."""
        try:
            return MonitoringConfig.model_validate(
                get_setting(self.store, SETTING) or {}
            ).model_dump()
        except ValidationError as error:
            log.warning(
                "stored monitoring settings are not valid (%s); monitoring starts from the "
                "defaults",
                error,
            )
            return MonitoringConfig().model_dump()

    def configure(self, changes: dict, attached: dict[str, Attached], known_sae) -> dict:
        """Apply and store new settings (validated whole; nothing changes on a refusal)."""
        config = validate_field(MonitoringConfig, {**self.config, **changes}).model_dump()
        # What depends on the server's state: the SAE exists (404 sae_not_found), the features fit
        # its width.
        if config["sae_id"] is not None:
            known_sae(config["sae_id"])
        if config["features"]:
            sae_id = config["sae_id"] or (next(iter(attached)) if len(attached) == 1 else None)
            if sae_id is None:
                raise InvalidRequest("name sae_id to watch particular features", param="sae_id")
            info = known_sae(sae_id)
            for index in config["features"]:
                check_feature(info, index, param="features")
        if config["enabled"]:
            self._choose(config, attached, strict=True)
        with self._lock:
            self.config = config
        set_setting(self.store, SETTING, config, topic=Topic.MONITORING)
        return self.describe(attached)

    def reload(self) -> None:
        """Read the stored settings again: another replica changed them."""
        config = self._stored()
        with self._lock:
            self.config = config

    def _choose(self, config: dict, attached: dict[str, Attached], strict: bool) -> Attached | None:
        """The attached SAE monitoring reads through, or None (a 400 when `strict`)."""
        sae_id = config["sae_id"]
        if sae_id is not None:
            found = attached.get(sae_id)
            if found is None and strict:
                raise InvalidRequest(
                    f"SAE {sae_id!r} is not attached; attach it before monitoring through it",
                    param="sae_id",
                    code="sae_not_attached",
                )
            return found
        if len(attached) == 1:
            return next(iter(attached.values()))
        if strict:
            if not attached:
                raise InvalidRequest(
                    "no SAE is attached; attach one before enabling monitoring",
                    param="sae_id",
                    code="sae_not_attached",
                )
            raise InvalidRequest(
                f"several SAEs are attached ({', '.join(sorted(attached))}); name one with sae_id",
                param="sae_id",
            )
        return None

    def describe(self, attached: dict[str, Attached]) -> dict:
        """Settings, what monitoring reads through now, and the counters."""
        config = dict(self.config)
        chosen = self._choose(config, attached, strict=False)
        return {
            **config,
            "read_point": "pre_steering",
            "reading": None
            if chosen is None or not config["enabled"]
            else {"sae_id": chosen.info.id, "layer": chosen.layer},
            "history": {
                "records": len(self.records),
                "max": self.records.maxlen,
                "batch_records": len(self.batch_records),
                "batch_max": self.batch_records.maxlen,
                "prompt_max_chars": self.prompts.max_chars,
            },
            "requests": self.requests,
            "positions_read": self.positions_read,
            "queue": {
                "pending": self._work.qsize(),
                "max": self._work.maxsize,
                "dropped": self.dropped,
            },
        }

    # requests ------------------------------------------------------------------------------------
    def read_for(
        self,
        attached: dict[str, Attached],
        origin: Origin,
        calibration: Callable[[str], PercentileTable | None] | None = None,
    ) -> tuple[ResidualRead, Callable[[ResidualsRead, Sequence[ProbeVerdict]], None]] | None:
        """For `origin`'s generation starting now: the read to add to its rows and the callback that
        hands each finished row's capture (with its active probes' verdicts) to the worker (None
        when monitoring is off or reads nothing); `calibration` gives an SAE's percentile table on
        the model, for `percentiles`."""
        config = self.config
        if not config["enabled"]:
            return None
        chosen = self._choose(config, attached, strict=False)
        if chosen is None:
            return None
        features = tuple(config["features"]) if config["features"] is not None else None
        top_k = config["top_k"]
        read = ResidualRead(
            chosen.read_point,
            False,
            config["positions"],
            "monitoring",
            encode=partial(encode_rows, chosen.sae, features=features, top_k=top_k),
        )

        asked = bool(config.get("percentiles"))
        table = calibration(chosen.info.id) if asked and calibration is not None else None
        tokens, labels = bool(config.get("tokens")), bool(config.get("labels"))

        def hand_over(captured: ResidualsRead, verdicts: Sequence[ProbeVerdict] = ()) -> None:
            probes = [verdict_fields(verdict) for verdict in verdicts]
            self.submit(
                Pending(
                    origin,
                    time.time(),
                    captured,
                    chosen,
                    features,
                    top_k,
                    asked,
                    table,
                    probes,
                    tokens,
                    labels,
                )
            )

        return read, hand_over

    def submit(self, pending: Pending) -> bool:
        """Queue a finished row's capture for the worker without ever waiting (it runs on the
        scheduler thread): past the queue's bound the record is dropped and counted. True if
        queued."""
        try:
            self._work.put_nowait(pending)
            return True
        except queue.Full:
            self._dropped(pending.request_id)
            return False

    def _dropped(self, request_id: str) -> None:
        with self._drop_lock:
            self.dropped += 1
            dropped, now = self.dropped, time.monotonic()
            if now - self._warned_at < DROP_WARNING_S:
                return
            self._warned_at = now
        log.warning(
            "monitoring cannot keep up: dropped the record of %s, %d captures already waiting (%d "
            "dropped since the last reset)",
            request_id,
            self._work.maxsize,
            dropped,
        )

    # the worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while (pending := self._work.get()) is not None:
            try:
                self._record(pending)
            except Exception:  # a bad record must not stop monitoring
                log.exception("monitoring could not record %s", pending.request_id)
            finally:
                self._work.task_done()

    def _record(self, pending: Pending) -> None:
        rows = pending.captured.encoded  # encoded on the scheduler thread: no torch work here
        if pending.percentiles:
            add_percentiles(rows, pending.table)  # numpy lookups in the calibration's grids
        if pending.labels:
            labels = self.labels(pending.attached.info.id)
            rows = [labelled(features, labels) for features in rows]
        token_ids = pending.captured.token_ids
        decode = pending.origin.decode
        texts = {t: decode([t]) for t in set(token_ids)} if pending.tokens else None
        batch = pending.origin.batch
        record = {
            "request_id": pending.request_id,
            **origin_fields(batch),
            "row": pending.captured.row,
            "prompt_index": pending.captured.row // pending.origin.choices,
            "time": pending.at,
            "sae_id": pending.attached.info.id,
            "layer": pending.attached.layer,
            "read_point": "pre_steering",
            "positions": [
                {
                    "position": p,
                    "token_id": t,
                    **({} if texts is None else {"token": texts[t]}),
                    "features": f,
                }
                for p, t, f in zip(pending.captured.positions, token_ids, rows, strict=True)
            ],
        }
        if pending.percentiles:
            record["percentiles"] = percentiles_block(pending.attached.info.id, pending.table)
        if pending.probes:
            record["probes"] = pending.probes
        if batch is None:
            self.prompts.keep(pending.origin)
        with self._lock:
            # never reused, so `after` polling survives a reset
            record["id"] = next(self._record_ids)
            if batch is not None:  # kept apart: no statistics, no live feed
                self.batch_records.append(record)
                return
            self.records.append(record)
            self.requests += 1
            self.positions_read += len(rows)
            for features in rows:
                for entry in features:
                    if entry["value"] > 0:
                        self.stats.setdefault(entry["index"], FeatureStats()).add(entry["value"])
        self.feed.publish(record)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every handed-over capture is recorded (tests, and a reset that must see
        them)."""
        deadline = time.monotonic() + timeout
        while self._work.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    # reading the results ------------------------------------------------------------------------
    def recent(
        self, limit: int, after: int | None, origin: str = "request", batch_id: str | None = None
    ) -> list[dict]:
        """Records, oldest first: the last `limit`, or those after record id `after`; of live
        requests, or (`origin` "batch") of batch lines, of one batch with `batch_id`."""
        with self._lock:
            kept = self.batch_records if origin == "batch" else self.records
            records = [
                r
                for r in kept
                if (after is None or r["id"] > after)
                and (batch_id is None or r.get("batch_id") == batch_id)
            ]
        return records[-limit:]

    def prompt(self, request_id: str) -> dict:
        """The prompts of a recorded request (404 when they are no longer kept)."""
        return self.prompts.get(request_id)

    def statistics(self) -> dict:
        """Per feature: positions where it fired, its mean and max value there, and the fraction of
        monitored positions where it fired. Watched features are all listed (0 when they never
        fired); watching all features lists those that fired."""
        with self._lock:
            seen = self.positions_read
            watched = self.config["features"] or []
            indices = sorted(set(self.stats) | set(watched))
            features = []
            for index in indices:
                s = self.stats.get(index, FeatureStats())
                features.append(
                    {
                        "index": index,
                        "count": s.active,
                        "mean": s.total / s.active if s.active else 0.0,
                        "max": s.peak,
                        "fraction_active": s.active / seen if seen else 0.0,
                    }
                )
        return {"positions_read": seen, "requests": self.requests, "features": features}

    def reset(self) -> None:
        """Forget every record and statistic (the settings stay)."""
        with self._lock:
            self.records.clear()
            self.batch_records.clear()
            self.prompts.clear()
            self.stats.clear()
            self.positions_read = 0
            self.requests = 0
        with self._drop_lock:
            self.dropped = 0

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the worker once it has recorded what is queued, and wait for it to end."""
        try:
            # waits only while the queue is full, for the worker to drain it
            self._work.put(None, timeout=timeout)
        except queue.Full:
            log.warning("monitoring worker did not drain its queue within %.0f s", timeout)
        self.worker.join(timeout)
        if self.worker.is_alive():
            log.warning("monitoring worker did not stop within %.0f s", timeout)
