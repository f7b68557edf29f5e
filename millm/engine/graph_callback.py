"""Reaching into llama.cpp's forward pass: its graph evaluation callback, on named nodes only.

llama.cpp asks an evaluation callback about every node of its graph before computing it ("do
you want this one?") and calls it again, for a node answered yes, once that node is computed and
before any later node has read it: its values can be read and rewritten in place there
(`ggml_backend_tensor_get` / `_set`, which work on any backend).

The callback is a few lines of C, compiled on first use with the C compiler llama-cpp-python's
own build needed and kept under the cache, for two reasons measured on a server:
- asking: a block has about 25 nodes, and a Python callback asked about each would cost a
  Python call per node and step; the C asker compares the node's name with the hooked ones (none
  hooked: it answers no at once and llama.cpp computes the graph whole);
- the GIL: a Python call in the middle of a decode must take the interpreter lock, which the
  server's event loop may hold for milliseconds (streaming 8 answers, it cost 25-30 % of decode
  speed). So a hooked node is served in C where it can be: its values copied to a buffer the
  runner gave (`before`), a per-token addition added and written back (`after`), no Python.
  Only a node with operations (functions of the residual: clamps, a transcoder's read) calls
  back into Python, with the values `[n, d]` float32, and gets them rewritten.
Without a compiler, the same asking and copying run in Python (slower, and under the GIL).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAX_HOOKS = 256
NAME_BYTES = 64  # GGML_MAX_NAME
GGML_TYPE_F32 = 0  # a tensor's first field is its ggml_type
FAILED_SIZE = 1  # what the C side reports when a node's size is not the decode's [n, d] float32

SOURCE = r"""
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#define MAX_HOOKS {hooks}
#define NAME_BYTES {name}
typedef const char * (*name_fn)(const void *);
typedef bool (*data_fn)(void *, int);
typedef size_t (*bytes_fn)(const void *);
typedef void (*copy_fn)(void *, void *, size_t, size_t);
struct millm_hook {
    char name[NAME_BYTES];
    int python;
    float * before;
    float * after;
    const float * add;
};
struct millm_hooks {
    name_fn name;
    data_fn data;
    bytes_fn nbytes;
    copy_fn get;
    copy_fn set;
    size_t expected;
    int count;
    int last;
    int failed;
    struct millm_hook hooks[MAX_HOOKS];
};
bool millm_eval(void * tensor, bool ask, void * user) {
    struct millm_hooks * h = (struct millm_hooks *) user;
    if (ask) {
        if (h->count == 0) return false;
        const char * name = h->name(tensor);
        for (int i = 0; i < h->count; i++) {
            if (strcmp(name, h->hooks[i].name) == 0) { h->last = i; return true; }
        }
        return false;
    }
    struct millm_hook * hook = &h->hooks[h->last];
    if (hook->python) return h->data(tensor, h->last);
    size_t bytes = h->nbytes(tensor);
    if (bytes != h->expected || hook->before == NULL) { h->failed = 1; return false; }
    h->get(tensor, hook->before, 0, bytes);
    if (hook->add != NULL) {
        size_t n = bytes / sizeof(float);
        for (size_t i = 0; i < n; i++) hook->after[i] = hook->before[i] + hook->add[i];
        h->set(tensor, hook->after, 0, bytes);
    }
    return true;
}
""".replace("{hooks}", str(MAX_HOOKS)).replace("{name}", str(NAME_BYTES))

DataFn = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int)
EvalFn = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
FloatPointer = ctypes.POINTER(ctypes.c_float)


class Hook(ctypes.Structure):
    """One hooked node (struct millm_hook): its name, whether Python serves it, and its buffers."""

    _fields_ = [
        ("name", ctypes.c_char * NAME_BYTES),
        ("python", ctypes.c_int),
        ("before", ctypes.c_void_p),
        ("after", ctypes.c_void_p),
        ("add", ctypes.c_void_p),
    ]


class HookTable(ctypes.Structure):
    """The C side's state (struct millm_hooks)."""

    _fields_ = [
        ("name", ctypes.c_void_p),
        ("data", DataFn),
        ("nbytes", ctypes.c_void_p),
        ("get", ctypes.c_void_p),
        ("set", ctypes.c_void_p),
        ("expected", ctypes.c_size_t),
        ("count", ctypes.c_int),
        ("last", ctypes.c_int),
        ("failed", ctypes.c_int),
        ("hooks", Hook * MAX_HOOKS),
    ]


def compiled_asker(cache: Path) -> Any:
    """The C callback (`millm_eval`), compiled once into `cache`; None when no C compiler works
    here."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    library = cache / f"millm-graph-hooks-{digest}.so"
    if not library.is_file():
        compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            return None
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as work:
                source, built = Path(work) / "hooks.c", Path(work) / library.name
                source.write_text(SOURCE)
                done = subprocess.run(
                    [compiler, "-O2", "-shared", "-fPIC", str(source), "-o", str(built)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                if done.returncode != 0:
                    log.warning(
                        "could not compile llama.cpp's graph hooks: %s", done.stderr.strip()
                    )
                    return None
                built.replace(library)  # whole or absent: another process may be reading the cache
        except (OSError, subprocess.SubprocessError) as exc:  # a read-only cache, a hung compiler
            log.warning("could not compile llama.cpp's graph hooks: %s", exc)
            return None
    return ctypes.CDLL(str(library)).millm_eval


@dataclass
class Buffers:
    """A natively served node's buffers for one decode: its values are copied to `before`; with
    `add`, before + add is written back and kept in `after`."""

    before: np.ndarray
    after: np.ndarray | None = None
    add: np.ndarray | None = None


class GraphHooks:
    """The evaluation callback of one llama.cpp context: which node names it stops at, each
    served natively (buffers given per decode with `arm`) or by `handler(index, values [n, d])`,
    which returns the rewritten values or None to leave them."""

    def __init__(self, ggml, handler: Callable[[int, np.ndarray], np.ndarray | None], cache: Path):
        self.ggml = ggml
        self._declare(ggml)
        self.handler = handler
        self.names: list[str] = []
        self.failure: BaseException | None = None
        self._armed: dict[int, Buffers] = {}  # kept alive while C holds their addresses
        self.table = HookTable()
        self.table.data = DataFn(self._on_data)
        address = lambda function: ctypes.cast(function, ctypes.c_void_p).value
        self.table.name = address(ggml.ggml_get_name)
        self.table.nbytes = address(ggml.ggml_nbytes)
        self.table.get = address(ggml.ggml_backend_tensor_get)
        self.table.set = address(ggml.ggml_backend_tensor_set)
        asker: Any = compiled_asker(cache)
        self.compiled = asker is not None
        if asker is None:
            log.warning(
                "no C compiler: llama.cpp's graph nodes are matched and copied in Python (slower)"
            )
            self._python_eval = EvalFn(self._ask_in_python)
            asker = self._python_eval
        self.callback = int(ctypes.cast(asker, ctypes.c_void_p).value or 0)
        self.user_data = ctypes.addressof(self.table)

    @staticmethod
    def _declare(ggml) -> None:
        ggml.ggml_get_name.restype = ctypes.c_char_p
        ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
        ggml.ggml_nbytes.restype = ctypes.c_size_t
        ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
        ggml.ggml_is_contiguous.restype = ctypes.c_bool
        ggml.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
        for name in ("ggml_backend_tensor_get", "ggml_backend_tensor_set"):
            function = getattr(ggml, name)
            function.restype = None
            function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

    def hook(self, nodes: list[tuple[str, bool]]) -> None:
        """Stop at these (name, served by Python) nodes from the next decode on (none: llama.cpp
        runs undisturbed)."""
        if len(nodes) > MAX_HOOKS:
            raise ValueError(f"at most {MAX_HOOKS} graph nodes can be hooked at once")
        for i, (name, python) in enumerate(nodes):
            entry = self.table.hooks[i]
            entry.name = name.encode()
            entry.python = int(python)
            entry.before = entry.after = entry.add = None
        self.table.count = len(nodes)
        self.names = [name for name, _ in nodes]
        self._armed = {}

    def arm(self, rows: int, width: int, buffers: dict[int, Buffers]) -> None:
        """The next decode has `rows` tokens of `width` values; natively served hook i uses
        buffers[i]."""
        self.table.expected = rows * width * 4
        self._armed = buffers
        for i in range(self.table.count):
            entry, given = self.table.hooks[i], buffers.get(i)
            entry.before = given.before.ctypes.data if given is not None else None
            entry.after = given.after.ctypes.data if given and given.after is not None else None
            entry.add = given.add.ctypes.data if given and given.add is not None else None

    def take_failure(self) -> BaseException | None:
        """What went wrong inside the last decode (llama.cpp cannot carry an exception), once."""
        failure, self.failure = self.failure, None
        if self.table.failed:
            self.table.failed = 0
            failure = failure or RuntimeError(
                "a hooked llama.cpp node did not hold this decode's [tokens, width] float32 values"
            )
        return failure

    def _ask_in_python(self, tensor: int, ask: bool, user: int) -> bool:
        if not ask:
            if self.table.hooks[self.table.last].python:
                return self._on_data(tensor, self.table.last)
            return self._serve_in_python(tensor, self.table.last)
        if not self.names:
            return False
        name = self.ggml.ggml_get_name(tensor).decode()
        if name in self.names:
            self.table.last = self.names.index(name)
            return True
        return False

    def _serve_in_python(self, tensor: int, index: int) -> bool:
        """What the C side does for a natively served node, without a compiler."""
        given = self._armed.get(index)
        size = int(self.ggml.ggml_nbytes(tensor))
        if given is None or size != self.table.expected:
            self.table.failed = FAILED_SIZE
            return False
        self.ggml.ggml_backend_tensor_get(tensor, given.before.ctypes.data, 0, size)
        if given.add is not None and given.after is not None:
            np.add(given.before, given.add, out=given.after)
            self.ggml.ggml_backend_tensor_set(tensor, given.after.ctypes.data, 0, size)
        return True

    def _on_data(self, tensor: int, index: int) -> bool:
        # An exception cannot cross llama.cpp: it is kept for the runner, and False stops the split.
        try:
            ggml = self.ggml
            if ctypes.c_int.from_address(
                tensor
            ).value != GGML_TYPE_F32 or not ggml.ggml_is_contiguous(tensor):
                raise RuntimeError(
                    f"llama.cpp's node {self.names[index]} is not contiguous float32"
                )
            size = int(ggml.ggml_nbytes(tensor))
            values = np.empty(size // 4, dtype=np.float32)
            ggml.ggml_backend_tensor_get(tensor, values.ctypes.data, 0, size)
            rewritten = self.handler(index, values)
            if rewritten is not None:
                rewritten = np.ascontiguousarray(rewritten, dtype=np.float32).reshape(-1)
                ggml.ggml_backend_tensor_set(tensor, rewritten.ctypes.data, 0, size)
            return True
        except BaseException as exc:  # handed to the runner after the decode
            self.failure = exc
            return False


def ggml_library():
    """llama-cpp-python's ggml base library (tensor names and values)."""
    from llama_cpp import _ctypes_extensions, _ggml

    return _ctypes_extensions.load_shared_library("ggml-base", _ggml.libggml_base_path)
