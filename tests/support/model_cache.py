"""Converted checkpoints kept between test runs: a GGUF file is dequantised (and Gemma 3's chunk
packages assembled) once per checkout and machine, not once per run.

A server started through `start_sharing` gets a new data directory whose `cache/` and `hub/`
folders are links to this checkout's folders under ~/.cache/millm-tests (MILLM_TEST_MODEL_CACHE
moves them): its database and everything else it writes are its own, the converted weights
are shared. The first start converts under a lock, so servers (and the subprocess runs of
test_cpu_kinds.py) that start together wait for one conversion instead of racing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from tests.support.server import ServerProcess

CHECKOUT = Path(__file__).resolve().parents[2]


def shared_folder(name: str) -> Path:
    """This checkout's persistent folder for `name` (one per checkout: a GGUF file's entry is
    keyed by its path)."""
    root = Path(os.environ.get("MILLM_TEST_MODEL_CACHE") or Path.home() / ".cache" / "millm-tests")
    return root / hashlib.sha256(str(CHECKOUT).encode()).hexdigest()[:12] / name


def start_sharing(
    name: str, home: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 600
) -> ServerProcess:
    """A ready server on a new data directory `home` whose converted models are `name`'s shared
    ones."""
    shared = shared_folder(name)
    home.mkdir(parents=True, exist_ok=True)
    for part in ("cache", "hub"):
        (shared / part).mkdir(parents=True, exist_ok=True)
        (home / part).symlink_to(shared / part, target_is_directory=True)
    with (shared.parent / f"{name}.lock").open("w") as lock:
        # released when the file closes, by this process or at its death
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = ServerProcess(home, args, env=env)
        try:
            return server.wait_ready(timeout=timeout)
        except BaseException:
            server.stop()
            raise
