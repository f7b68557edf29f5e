"""Replicas on one PostgreSQL store: this process's copy of the shared state kept in step.

The store holds every piece of shared state; each book, the SAE registry and the steering state
keep a copy in memory for speed. When another replica commits a change, PostgreSQL tells this
one (LISTEN/NOTIFY, store/changes.py) which part changed, and the part's reload reads it again.
While the listening connection is down this replica cannot know what changed elsewhere: it says
so (`in_step` is False with the reason: /api/steering answers live false, readiness 503, and
every response's X-miLLM-Steering carries `unsynced`) until it has reconnected, listened again
and reloaded everything, in that order, so no change committed meanwhile is missed.

On SQLite (one process owns the file) nothing is listened for: the copy is current by construction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from millm.store.changes import ChangeListener, Topic
from millm.store.database import Store

log = logging.getLogger(__name__)

FIRST_SYNC_S = (
    10.0  # how long the start waits for the first LISTEN before it goes on, reporting not in step
)


@dataclass
class ReplicaCounters:
    """What the listener has done, for /api/health/inference and the scaling benchmark."""

    notices: int = 0  # changes made by other replicas and applied here
    reloads: int = 0  # full reloads (at start and after each reconnection)
    losses: int = 0  # times the listening connection was lost
    last_notice_at: float | None = None  # wall clock of the last applied change


class Replication:
    """Keeps the in-memory copies in step with the store: a reload per topic, all of them on
    (re)connection."""

    def __init__(self, store: Store):
        self.store = store
        self.shared = store.shared
        self._reloads: dict[Topic, Callable[[], None]] = {}
        self._lock = threading.Lock()
        # before the first LISTEN a replica cannot know it is current
        self._connected = not self.shared
        self._reason = "the change listener has not connected to the shared database yet"
        self._lost_at: float | None = None
        self._first = threading.Event()
        self.counters = ReplicaCounters()
        self.generation = (
            0  # moves whenever being in step changes, so plans cached before are not reused
        )
        self._listener: ChangeListener | None = None

    def on(self, topic: Topic, reload: Callable[[], None]) -> None:
        """Call `reload` when another replica changes `topic` (and on every full reload, in
        registration order)."""
        self._reloads[topic] = reload

    def start(self) -> None:
        """Listen for other replicas' changes (PostgreSQL only); waits briefly for the first
        LISTEN."""
        if not self.shared:
            return
        self._listener = ChangeListener(self.store.url, self._notice, self._listening, self._lost)
        self._listener.start()
        if not self._first.wait(FIRST_SYNC_S):
            log.warning(
                "the change listener has not connected within %g s; this replica reports itself "
                "out of step until it does",
                FIRST_SYNC_S,
            )

    def close(self) -> None:
        """Stop listening."""
        if self._listener is not None:
            self._listener.close()

    # what the listener reports --------------------------------------------------------------------
    def _notice(self, topic: Topic, origin: str) -> None:
        if origin == self.store.origin:
            return  # this process's own change: its copy was read back when it committed
        self._reloads.get(topic, _nothing)()
        with self._lock:
            self.counters.notices += 1
            self.counters.last_notice_at = time.time()

    def _listening(self) -> None:
        # LISTEN is in place: whatever commits from now on is noticed, so a full read now misses
        # nothing. The pool's idle connections may be as dead as the lost one (a silent peer never
        # says so): the reload reads through fresh ones.
        if self.counters.reloads or self.counters.losses:
            self.store.engine.dispose()
        try:
            for reload in self._reloads.values():
                reload()
        except Exception as exc:
            self._lost(f"reloading the shared state failed: {exc}")
            raise
        with self._lock:
            self._connected, self._lost_at = True, None
            self.counters.reloads += 1
            self.generation += 1
        if self.counters.reloads > 1:
            log.info("back in step with the shared database (state reloaded)")
        self._first.set()

    def _lost(self, reason: str) -> None:
        with self._lock:
            if self._connected or self._lost_at is None:
                self._lost_at = time.time()
                self.counters.losses += 1
                # Idle pool connections go too: a write now connects afresh, and fails in seconds
                # (connect_timeout) rather than waiting on a connection as dead as this one.
                self.store.engine.dispose()
                log.warning(
                    "lost the connection to the shared database (%s); this replica reports itself "
                    "out of step until it reconnects",
                    reason,
                )
            self._connected, self._reason = False, reason
            self.generation += 1
        self._first.set()

    # what the replica answers ---------------------------------------------------------------------
    def in_step(self) -> tuple[bool, str]:
        """(True, "") when this copy is known current; else False and why (for `live` answers and
        readiness)."""
        with self._lock:
            if self._connected:
                return True, ""
            since = (
                f" since {time.strftime('%H:%M:%S', time.gmtime(self._lost_at))} UTC"
                if self._lost_at
                else ""
            )
            return False, (
                f"this replica is out of step with the shared database{since} ({self._reason}): "
                "changes made through other replicas may not have reached it; it serves with the "
                "state it last read until it reconnects and reloads"
            )

    def view(self) -> dict:
        """This replica's standing: shared or not, in step, since when not, and its counters."""
        in_step, reason = self.in_step()
        with self._lock:
            counters = self.counters
            return {
                "shared": self.shared,
                "replica_id": self.store.origin,
                "in_step": in_step,
                "reason": reason or None,
                "out_of_step_since": self._lost_at,
                "changes_applied": counters.notices,
                "reloads": counters.reloads,
                "connection_losses": counters.losses,
                "last_change_at": counters.last_notice_at,
            }


def _nothing() -> None:
    """A topic no part of this process keeps a copy of."""


class InStep(Protocol):
    """Whether this process's copy of the stored state is known to be current
    (kernel/runtime/replication.py)."""

    def in_step(self) -> tuple[bool, str]:
        """(True, "") when current; else False and why."""


class _AlwaysInStep:
    """One process on its own database: its copy is current by construction."""

    def in_step(self) -> tuple[bool, str]:
        return True, ""


ALWAYS_IN_STEP = _AlwaysInStep()
