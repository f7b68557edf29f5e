"""A real `millm serve` process on 127.0.0.1 for tests, started and stopped by fixtures."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.zygote import ForkedServer, Zygote

TEST_ROOT: Path | None = (
    None  # pytest's base temporary folder, set by the session fixture in conftest.py
)
_zygote: Zygote | None = None


def zygote() -> Zygote:
    """This pytest process's zygote, started on first use (MILLM_TEST_FORK=0: none, every server
    a new interpreter)."""
    global _zygote
    if _zygote is None:
        # short: a Unix socket's path is at most 107 bytes
        _zygote = Zygote(Path(tempfile.mkdtemp(prefix="millm-zygote-")))
        atexit.register(_zygote.stop)
    return _zygote


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`millm serve ...` in a process of its own, forked from the zygote (tests/support/zygote.py)
    or, with `fork=False`, `python -m millm serve ...`; its log is kept for failure messages."""

    def __init__(
        self,
        home: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        allowed: list[Path] | None = None,
        fork: bool = True,
    ):
        """`allowed` are the MILLM_ALLOWED_PATHS; by default the session's temporary folder
        (`TEST_ROOT`), where tests build the checkpoints and SAEs they register over HTTP."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / f"server-{self.port}.log"
        home.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "millm",
            "serve",
            "--port",
            str(self.port),
            "--home",
            str(home),
            *args,
        ]
        allowed_paths = os.pathsep.join(
            str(p) for p in (allowed if allowed is not None else [TEST_ROOT or home.parent])
        )
        environment = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "MILLM_ALLOWED_PATHS": allowed_paths,
            **(env or {}),
        }
        self.log_path.write_text("")
        self.process: ForkedServer | subprocess.Popen
        if (
            fork
            and os.environ.get("MILLM_TEST_FORK", "1") != "0"
            and zygote().can_fork(environment)
        ):
            self.process = ForkedServer(zygote(), command[3:], environment, self.log_path)
        else:
            with self.log_path.open("w") as log:
                self.process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=environment
                )

    @property
    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 300.0) -> ServerProcess:
        """Block until /api/health/ready answers 200 (or fail with the server's log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log}")
            try:
                if httpx.get(f"{self.base_url}/api/health/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log}")

    def stop(self) -> None:
        """SIGINT (uvicorn's graceful stop), then kill if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
