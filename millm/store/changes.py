"""Change notices between replicas sharing one PostgreSQL store: PostgreSQL's LISTEN/NOTIFY.

Every write transaction names what it changed (a `Topic`); on PostgreSQL the transaction sends
`pg_notify(CHANNEL, '<topic> <origin>')` before it commits, and PostgreSQL delivers the notice
to every listening connection when, and only when, it commits. A `ChangeListener` is one
replica's listening connection: a thread that hands each notice to a callback, says when the
connection is lost (the replica then cannot know what changed elsewhere) and, on reconnecting,
says so only after LISTEN is in place again, so a reload made then misses nothing.

SQLite has no notices and needs none: one process owns the file (see single_process.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url

log = logging.getLogger(__name__)

CHANNEL = "millm_changes"
PING_S = 1.0  # with no notice for this long, the connection is checked
PING_DEADLINE_S = 3.0  # a check unanswered for this long counts as a lost connection
# libpq's own limits, so that a silent partition (no reset, no FIN) is found in seconds rather than
# after TCP's retransmissions give up (minutes): connecting, unacknowledged data, idle keepalives.
LIVENESS = {
    "connect_timeout": 5,
    "tcp_user_timeout": 5000,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 1,
    "keepalives_count": 3,
}
RETRY_S = (0.1, 0.25, 0.5, 1.0, 2.0)  # waits between reconnection attempts, the last repeated


class Topic(StrEnum):
    """What a write changed: a replica reloads that part of its memory."""

    STEERING = "steering"  # live values, enabled, the active base and its version, attachments
    PROFILES = "profiles"
    CLUSTERS = "clusters"
    CIRCUITS = "circuits"
    SAES = "saes"
    LABELS = "labels"
    CALIBRATIONS = "calibrations"
    VECTORS = "vectors"
    PROBES = "probes"
    MODELS = "models"
    VARIANTS = "variants"
    EVALUATIONS = "evaluations"
    TRANSCODERS = "transcoders"  # registered transcoder sets
    MONITORING = "monitoring"  # which features monitoring watches (the records stay per replica)
    BATCHES = "batches"  # a batch has lines to run or to end: every replica's runner looks now
    SENSING = "sensing"  # which clusters and circuits are sensed, and how (events are read anew)
    DICTIONARIES = "dictionaries"  # trainings and grades (read anew by every view)


def announce(conn: Connection, topic: Topic, origin: str) -> None:
    """Queue a notice of `topic` from `origin` in this transaction (sent on commit; nothing on
    SQLite)."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": CHANNEL, "payload": f"{topic.value} {origin}"},
        )


def parse_notice(payload: str) -> tuple[Topic, str] | None:
    """(topic, origin) of a notice's payload; None for one this version does not know (a newer
    replica's)."""
    name, _, origin = payload.partition(" ")
    try:
        return Topic(name), origin
    except ValueError:
        return None


def driver_dsn(url: str) -> str:
    """The libpq connection string of a SQLAlchemy PostgreSQL URL (psycopg connects with it)."""
    parsed = make_url(url).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


class ChangeListener:
    """One thread holding one LISTEN connection: `on_notice(topic, origin)` per notice,
    `on_lost(reason)` when the connection fails, `on_listening()` once LISTEN is in place
    (at start and after every reconnection)."""

    def __init__(
        self,
        url: str,
        on_notice: Callable[[Topic, str], None],
        on_listening: Callable[[], None],
        on_lost: Callable[[str], None],
    ):
        self.dsn = driver_dsn(url)
        self.on_notice, self.on_listening, self.on_lost = on_notice, on_listening, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="millm-changes", daemon=True)
        self._conn: Any = None  # a psycopg connection while listening

    def start(self) -> None:
        """Start listening (the first `on_listening` or `on_lost` follows from the thread)."""
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                self._listen()
                attempt = 0
            except Exception as exc:  # any failure of the connection: say so, then reconnect
                if self._stop.is_set():
                    break
                self.on_lost(_reason(exc))
                self._stop.wait(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1
            finally:
                self._close_connection()

    def _listen(self) -> None:
        import psycopg
        from psycopg.conninfo import make_conninfo

        self._conn = conn = psycopg.connect(make_conninfo(self.dsn, **LIVENESS), autocommit=True)
        conn.execute(f"LISTEN {CHANNEL}")
        self.on_listening()
        while not self._stop.is_set():
            quiet = True
            for notice in conn.notifies(timeout=PING_S):
                quiet = False
                parsed = parse_notice(notice.payload)
                if parsed is not None:
                    self._deliver(*parsed)
                if self._stop.is_set():
                    return
            if quiet:
                self._ping(conn)

    def _ping(self, conn) -> None:
        """SELECT 1, raising if the server or the path to it is gone, or gives no answer within
        PING_DEADLINE_S (a hung server or a path that swallows data while its TCP still
        acknowledges it: no timeout of libpq's fires then). A late answer is cut off by shutting
        the socket down under the waiting call, which then raises like any lost connection."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _shut_down(conn.fileno())

        timer = threading.Timer(PING_DEADLINE_S, expire)
        timer.start()
        try:
            conn.execute("SELECT 1")
        except Exception as exc:
            if expired.is_set():
                raise ConnectionError(
                    f"no answer from the database within {PING_DEADLINE_S:g} s"
                ) from exc
            raise
        finally:
            timer.cancel()

    def _deliver(self, topic: Topic, origin: str) -> None:
        try:
            self.on_notice(topic, origin)
        except (
            Exception
        ):  # a reload that failed must not end the listening: logged, and the next notice retries
            log.exception("applying a %s change from another replica failed", topic.value)

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the LISTEN connection failed", exc_info=True)


def _shut_down(fd: int) -> None:
    """Shut a socket down for reading and writing through a duplicate of its descriptor (the
    owner's blocked call returns with an error; the owner still closes its own descriptor)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        log.debug("shutting down an unanswered LISTEN connection failed", exc_info=True)


def _reason(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
