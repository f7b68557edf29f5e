"""A private PostgreSQL server for tests (Debian's binaries, started in a temporary folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.server import free_port

BIN = Path("/usr/lib/postgresql")


def binaries() -> Path | None:
    """The newest installed PostgreSQL bin folder, if any."""
    if not BIN.is_dir():
        return None
    versions = sorted(
        (p for p in BIN.iterdir() if (p / "bin" / "initdb").is_file()), key=lambda p: int(p.name)
    )
    return versions[-1] / "bin" if versions else None


def _as_postgres(command: list[str]) -> list[str]:
    # initdb refuses to run as root; run as the postgres system user when we are root.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


class PostgresServer:
    """initdb + pg_ctl start on a free port; `url` for SQLAlchemy with psycopg."""

    def __init__(self):
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed")
        # Its own folder under /tmp: pytest's are private to root, and postgres must reach it.
        self.base = base = Path(tempfile.mkdtemp(prefix="millm-pg-"))
        self.bin, self.data, self.port = bin_dir, base / "pgdata", free_port()
        if os.geteuid() == 0:
            shutil.chown(base, "postgres")
        subprocess.run(
            _as_postgres(
                [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust"]
            ),
            check=True,
            capture_output=True,
        )
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    f"-p {self.port} -k {base} -h 127.0.0.1",
                    "-l",
                    str(base / "log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self._wait()
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "createdb"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-U",
                    "postgres",
                    "millm",
                ]
            ),
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/millm"

    def _wait(self) -> None:
        for _ in range(100):
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("PostgreSQL did not become ready")

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        subprocess.run(
            _as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(self.base, ignore_errors=True)
