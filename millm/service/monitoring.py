"""Live feature monitoring: which SAE and features to watch, per-request records, statistics, a feed.

The Monitor is the one owner of monitoring state. A monitored generation row carries a
ResidualRead (pre_steering, at the watched SAE's point) whose encode runs on the scheduler
thread when the row finishes (torch work on another live thread slows every decode step);
the encoded capture is handed to the monitor's worker thread, which keeps a record (bounded
history), updates per-feature statistics and pushes the record to every live subscriber. An
unmonitored request carries no read at all. Scoring and embeddings are never monitored.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from millm.engine.jobs import ResidualRead, ResidualsRead
from millm.errors import InvalidRequest
from millm.interp.steering import Attached, check_feature
from millm.service.activations import POSITION_WORDS, encode_rows
from millm.store.database import Store

log = logging.getLogger(__name__)

SETTING = "monitoring"
DEFAULTS = {"enabled": False, "sae_id": None, "features": None, "top_k": 5, "positions": "completion"}
MAX_TOP_K = 64
SUBSCRIBER_BACKLOG = 1000  # records a slow live client may fall behind before it misses some


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

    request_id: str
    at: float
    captured: ResidualsRead
    attached: Attached
    features: tuple[int, ...] | None
    top_k: int


@dataclass
class Subscriber:
    """A live feed client: its event loop and queue."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    dropped: int = field(default=0)


class Monitor:
    """Monitoring settings (persisted), records, statistics and live subscribers."""

    def __init__(self, store: Store, history: int):
        self.store = store
        self.config = {**DEFAULTS, **(store.get_setting(SETTING) or {})}
        self.records: collections.deque[dict] = collections.deque(maxlen=history)
        self.stats: dict[int, FeatureStats] = {}
        self.positions_read = 0
        self.requests = 0
        self._ids = itertools.count(1)
        self._record_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._work: queue.Queue[Pending | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="millm-monitor", daemon=True)
        self._worker.start()

    # settings ------------------------------------------------------------------------------------
    def configure(self, changes: dict, attached: dict[str, Attached], known_sae) -> dict:
        """Apply and store new settings (validated whole; nothing changes on a refusal)."""
        unknown = set(changes) - set(DEFAULTS)
        if unknown:
            raise InvalidRequest(f"unknown monitoring settings: {', '.join(sorted(unknown))}", param=sorted(unknown)[0])
        config = {**self.config, **changes}
        if not isinstance(config["enabled"], bool):
            raise InvalidRequest("enabled must be true or false", param="enabled")
        if config["positions"] not in POSITION_WORDS:
            raise InvalidRequest(f"positions must be one of {', '.join(POSITION_WORDS)}", param="positions")
        top_k = config["top_k"]
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
            raise InvalidRequest(f"top_k must be an integer from 1 to {MAX_TOP_K}", param="top_k")
        if config["sae_id"] is not None:
            known_sae(config["sae_id"])  # 404 sae_not_found for an unknown id
        features = config["features"]
        if features is not None:
            if not isinstance(features, list):
                raise InvalidRequest("features must be a list of feature indices (or null for all)", param="features")
            if features:
                sae_id = config["sae_id"] or (next(iter(attached)) if len(attached) == 1 else None)
                if sae_id is None:
                    raise InvalidRequest("name sae_id to watch particular features", param="sae_id")
                info = known_sae(sae_id)
                config["features"] = list(dict.fromkeys(check_feature(info, i, param="features") for i in features))
        if config["enabled"]:
            self._choose(config, attached, strict=True)
        with self._lock:
            self.config = config
        self.store.set_setting(SETTING, config)
        return self.describe(attached)

    def _choose(self, config: dict, attached: dict[str, Attached], strict: bool) -> Attached | None:
        """The attached SAE monitoring reads through, or None (a 400 when `strict`)."""
        sae_id = config["sae_id"]
        if sae_id is not None:
            found = attached.get(sae_id)
            if found is None and strict:
                raise InvalidRequest(f"SAE {sae_id!r} is not attached; attach it before monitoring through it", param="sae_id", code="sae_not_attached")
            return found
        if len(attached) == 1:
            return next(iter(attached.values()))
        if strict:
            if not attached:
                raise InvalidRequest("no SAE is attached; attach one before enabling monitoring", param="sae_id", code="sae_not_attached")
            raise InvalidRequest(f"several SAEs are attached ({', '.join(sorted(attached))}); name one with sae_id", param="sae_id")
        return None

    def describe(self, attached: dict[str, Attached]) -> dict:
        """Settings, what monitoring reads through now, and the counters."""
        config = dict(self.config)
        chosen = self._choose(config, attached, strict=False)
        return {
            **config,
            "read_point": "pre_steering",
            "reading": None if chosen is None or not config["enabled"] else {"sae_id": chosen.info.id, "layer": chosen.layer},
            "history": {"records": len(self.records), "max": self.records.maxlen},
            "requests": self.requests,
            "positions_read": self.positions_read,
        }

    # requests ------------------------------------------------------------------------------------
    def read_for(self, attached: dict[str, Attached]) -> tuple[ResidualRead, Callable[[ResidualsRead], None]] | None:
        """For a generation starting now: the read to add to its rows and the callback that hands
        each finished row's capture to the worker (None when monitoring is off or reads nothing)."""
        config = self.config
        if not config["enabled"]:
            return None
        chosen = self._choose(config, attached, strict=False)
        if chosen is None:
            return None
        features = tuple(config["features"]) if config["features"] is not None else None
        request_id = f"req-{next(self._ids)}"
        top_k = config["top_k"]
        read = ResidualRead(
            chosen.point, False, config["positions"], "monitoring",
            encode=partial(encode_rows, chosen.sae, features=features, top_k=top_k),
        )

        def hand_over(captured: ResidualsRead) -> None:
            self._work.put(Pending(request_id, time.time(), captured, chosen, features, top_k))

        return read, hand_over

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
        record = {
            "request_id": pending.request_id,
            "row": pending.captured.row,
            "time": pending.at,
            "sae_id": pending.attached.info.id,
            "layer": pending.attached.layer,
            "read_point": "pre_steering",
            "positions": [
                {"position": p, "token_id": t, "features": f}
                for p, t, f in zip(pending.captured.positions, pending.captured.token_ids, rows, strict=True)
            ],
        }
        with self._lock:
            record["id"] = next(self._record_ids)  # never reused, so `after` polling survives a reset
            self.records.append(record)
            self.requests += 1
            self.positions_read += len(rows)
            for features in rows:
                for entry in features:
                    if entry["value"] > 0:
                        self.stats.setdefault(entry["index"], FeatureStats()).add(entry["value"])
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            subscriber.loop.call_soon_threadsafe(self._push, subscriber, record)

    @staticmethod
    def _push(subscriber: Subscriber, record: dict) -> None:
        try:
            subscriber.queue.put_nowait(record)
        except asyncio.QueueFull:
            subscriber.dropped += 1

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every handed-over capture is recorded (tests, and a reset that must see them)."""
        deadline = time.monotonic() + timeout
        while self._work.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    # reading the results ------------------------------------------------------------------------
    def recent(self, limit: int, after: int | None) -> list[dict]:
        """Records, oldest first: the last `limit`, or those after record id `after`."""
        with self._lock:
            records = [r for r in self.records if after is None or r["id"] > after]
        return records[-limit:]

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
                features.append({
                    "index": index,
                    "count": s.active,
                    "mean": s.total / s.active if s.active else 0.0,
                    "max": s.peak,
                    "fraction_active": s.active / seen if seen else 0.0,
                })
        return {"positions_read": seen, "requests": self.requests, "features": features}

    def reset(self) -> None:
        """Forget every record and statistic (the settings stay)."""
        with self._lock:
            self.records.clear()
            self.stats.clear()
            self.positions_read = 0
            self.requests = 0

    def subscribe(self) -> Subscriber:
        """A live feed for the calling event loop."""
        subscriber = Subscriber(asyncio.get_running_loop(), asyncio.Queue(maxsize=SUBSCRIBER_BACKLOG))
        with self._lock:
            self._subscribers.append(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """The feed's client went away."""
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def close(self) -> None:
        """Stop the worker."""
        self._work.put(None)
