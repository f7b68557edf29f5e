"""One server process per SQLite file.

Each process keeps a copy of the shared state in memory, and SQLite cannot tell a process that
another one changed the file: two servers on one SQLite file would each steer by their own copy
and drift apart without a word. So a server holds an exclusive lock on `<file>.lock` for as long
as it runs, and a second one is refused at start, naming the first. The kernel drops the lock
when the process ends, however it ends (kill -9 included), so a crash never leaves it stuck.
Several replicas share one PostgreSQL database instead (DATABASE_URL, docs/scaling.md).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from sqlalchemy.engine import make_url


class DatabaseInUse(RuntimeError):
    """Another server process holds this SQLite file."""


class SqliteClaim:
    """The held lock on one SQLite file (None-like for other databases); `release` at shutdown."""

    def __init__(self, handle: IO[str] | None):
        self._handle = handle

    def release(self) -> None:
        """Let another process use the file."""
        if self._handle is not None:
            self._handle.close()  # closing the descriptor drops the flock
            self._handle = None


def claim_sqlite(url: str) -> SqliteClaim:
    """Take the SQLite file of `url` for this process (DatabaseInUse if another server has it);
    other databases need no claim."""
    parsed = make_url(url)
    if (
        parsed.get_backend_name() != "sqlite"
        or not parsed.database
        or parsed.database == ":memory:"
    ):
        return SqliteClaim(None)
    database = Path(parsed.database).resolve()
    lock_path = database.with_name(database.name + ".lock")
    handle = open(lock_path, "a+")  # noqa: SIM115 (held open for the process's life: the lock lives on the descriptor)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise DatabaseInUse(
            f"another millm server (pid {holder}) is using the SQLite database {database}. Two "
            "servers on one SQLite file would each keep their own copy of the steering state and "
            "drift apart. Stop the other one, give this one its own data directory (MILLM_HOME), "
            "or run replicas on a shared PostgreSQL database (DATABASE_URL; see docs/scaling.md)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return SqliteClaim(handle)
