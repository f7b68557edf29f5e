"""A process that has imported millm once and forks a `millm serve` for each test server.

A test server's start was mostly Python importing torch, transformers, FastAPI and millm, and
transformers' model code at the first load (most of its 7 s on 2 cores), paid again by each of
the suite's ~70 starts. The zygote pays it once
per pytest process: it imports the server's modules without running any of them, then, asked
for a server, forks; the child sets the environment it was given, points stdout and stderr at
the server's log and runs `millm.cli.main` on the arguments, as `python -m millm serve` would
(the CLI's own tests still start `python -m millm`). It is gunicorn's preload, for tests.

The zygote runs no Python thread besides its main one (a fork copies only the forking thread, so no
other thread may hold a lock then) and computes nothing before forking: ATen, MKL and oneDNN read
their ISA caps and MKL_CBWR at their first operation, so each child still takes them from its own
environment. It reaps its children itself and answers, over a Unix socket, one JSON line per
request: {"spawn": {"argv", "env", "log", "cwd"}} -> {"pid"}; {"poll": pid} -> {"returncode": int |
null}.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

# What a server imports on its way to serving: millm's app (torch, transformers, FastAPI, the MCP
# SDK, every route), the server, and the model classes transformers imports lazily at the first load
# (about 4 s: its generation and masking code, torch._dynamo), for every family the tests build.
PRELOADED = [
    "millm.server.app",
    "millm.cli",
    "uvicorn",
    "transformers.modeling_gguf_pytorch_utils",
    *(
        f"transformers.models.{family}.modeling_{family}"
        for family in (
            "llama",
            "gemma2",
            "gemma3",
            "mistral",
            "qwen2",
            "qwen3",
            "phi3",
            "gpt2",
            "gpt_neox",
        )
    ),
]


def serve_forever(path: str) -> None:
    """The zygote's loop: import, then fork on request and reap, until its parent goes."""
    for name in PRELOADED:
        importlib.import_module(name)
    import millm.cli

    parent = os.getppid()
    # No Python thread may run when it forks (the native ones, OpenBLAS's servers for numpy and
    # SciPy, are reset by their libraries' fork handlers, as for a DataLoader's forked workers).
    assert threading.active_count() == 1, "a zygote must hold one Python thread when it forks"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    exits: dict[int, int] = {}
    print("ready", flush=True)
    while os.getppid() == parent:
        for _ in selector.select(timeout=0.2):
            connection, _ = listener.accept()
            with connection, connection.makefile("rw") as stream:
                request = json.loads(stream.readline())
                if "spawn" in request:
                    answer = {"pid": _fork(request["spawn"], listener, millm.cli.main)}
                else:
                    answer = {"returncode": exits.get(request["poll"])}
                stream.write(json.dumps(answer) + "\n")
        with contextlib.suppress(ChildProcessError):
            while (found := os.waitpid(-1, os.WNOHANG))[0]:
                exits[found[0]] = os.waitstatus_to_exitcode(found[1])


def _fork(spawn: dict, listener: socket.socket, main) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        listener.close()
        os.setpgid(0, 0)  # its own group, as a subprocess started apart from the others
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(spawn["env"])
        os.chdir(spawn["cwd"])
        log = os.open(spawn["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.argv = ["millm", *spawn["argv"]]
        code = main(spawn["argv"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# Variables read when a library loads (OpenMP's thread count, the hub's endpoint and offline
# switch), not when it first computes: a server whose environment differs from the zygote's in one
# of them cannot be forked from it and starts as a new interpreter.
READ_AT_IMPORT = (
    "OMP_",
    "MKL_NUM_THREADS",
    "OPENBLAS_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH_",
    "PYTORCH_",
)


class Zygote:
    """The pytest side: starts the zygote on first use and asks it for servers."""

    def __init__(self, folder: Path):
        self.path = str(folder / "zygote.sock")
        self.environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote", self.path],
            env=self.environment,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert (
            self.process.stdout is not None and self.process.stdout.readline().strip() == b"ready"
        ), "the zygote did not start"

    def can_fork(self, environment: dict[str, str]) -> bool:
        """Whether a server with this environment behaves forked as it would started anew."""
        names = {
            name for name in {*environment, *self.environment} if name.startswith(READ_AT_IMPORT)
        }
        return all(environment.get(name) == self.environment.get(name) for name in names)

    def ask(self, request: dict) -> dict:
        """One request, one answer."""
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(self.path)
            stream = connection.makefile("rw")
            stream.write(json.dumps(request) + "\n")
            stream.flush()
            return json.loads(stream.readline())

    def stop(self) -> None:
        """End the zygote (its servers are stopped by their own fixtures)."""
        self.process.kill()
        self.process.wait()


class ForkedServer:
    """A forked server process, with the part of `subprocess.Popen` the tests use."""

    def __init__(self, zygote: Zygote, argv: list[str], env: dict[str, str], log: Path):
        self.zygote = zygote
        self.pid = zygote.ask(
            {"spawn": {"argv": argv, "env": env, "log": str(log), "cwd": os.getcwd()}}
        )["pid"]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once it has exited, else None."""
        if self.returncode is None:
            self.returncode = self.zygote.ask({"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit (subprocess.TimeoutExpired past `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"millm server {self.pid}", timeout or 0)
            time.sleep(0.05)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal the server (nothing if it has exited)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve_forever(sys.argv[1])
