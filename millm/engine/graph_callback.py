"""Reaching into llama.cpp's forward pass: its graph evaluation callback, on named nodes only.

llama.cpp asks an evaluation callback about every node of its graph before computing it ("do
you want this one?") and calls it again, for a node answered yes, once that node is computed and
before any later node has read it: its values can be read and rewritten in place there
(`ggml_backend_tensor_get` / `_set`, which work on any backend). A block has about 25 nodes, so
asking Python about each would cost a Python call per node and step. The asking is therefore a
few lines of C, compiled on first use with the C compiler llama-cpp-python's own build needed and
kept under the cache: it compares each node's name with the hooked names (none: it answers no at
once, and llama.cpp computes the graph whole) and calls Python only for a hooked node. Without a
compiler the same asking runs in Python, slower (bench/README.md measures both).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAX_HOOKS = 256
NAME_BYTES = 64  # GGML_MAX_NAME
GGML_TYPE_F32 = 0  # a tensor's first field is its ggml_type

SOURCE = r"""
#include <stdbool.h>
#include <string.h>
#define MAX_HOOKS {hooks}
#define NAME_BYTES {name}
typedef const char * (*name_fn)(const void *);
typedef bool (*data_fn)(void *, int);
struct millm_hooks {
    name_fn name;
    data_fn data;
    int count;
    int last;
    char names[MAX_HOOKS][NAME_BYTES];
};
bool millm_eval(void * tensor, bool ask, void * user) {
    struct millm_hooks * hooks = (struct millm_hooks *) user;
    if (!ask) return hooks->data(tensor, hooks->last);
    if (hooks->count == 0) return false;
    const char * name = hooks->name(tensor);
    for (int i = 0; i < hooks->count; i++) {
        if (strcmp(name, hooks->names[i]) == 0) { hooks->last = i; return true; }
    }
    return false;
}
""".replace("{hooks}", str(MAX_HOOKS)).replace("{name}", str(NAME_BYTES))

NameFn = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)
DataFn = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int)
EvalFn = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)


class HookTable(ctypes.Structure):
    """The C side's view of the hooked names (struct millm_hooks)."""

    _fields_ = [
        ("name", ctypes.c_void_p),
        ("data", DataFn),
        ("count", ctypes.c_int),
        ("last", ctypes.c_int),
        ("names", (ctypes.c_char * NAME_BYTES) * MAX_HOOKS),
    ]


def compiled_asker(cache: Path) -> Any:
    """The C callback (`millm_eval`), compiled once into `cache`; None when no C compiler works here."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    library = cache / f"millm-graph-hooks-{digest}.so"
    if not library.is_file():
        compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            return None
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
                log.warning("could not compile llama.cpp's graph hooks: %s", done.stderr.strip())
                return None
            built.replace(library)  # whole or absent: another process may be reading the cache
    return ctypes.CDLL(str(library)).millm_eval


class GraphHooks:
    """The evaluation callback of one llama.cpp context: which node names it stops at, and the
    Python function called with each such node (its index among the names, its values `[n, d]`
    float32) that returns the rewritten values, or None to leave them."""

    def __init__(self, ggml, handler: Callable[[int, np.ndarray], np.ndarray | None], cache: Path):
        self.ggml = ggml
        self._declare(ggml)
        self.handler = handler
        self.names: list[str] = []
        self.failure: BaseException | None = None
        self.table = HookTable()
        self.table.name = ctypes.cast(ggml.ggml_get_name, ctypes.c_void_p).value
        self.table.data = DataFn(self._on_data)
        asker: Any = compiled_asker(cache)
        self.compiled = asker is not None
        if asker is None:
            log.warning(
                "no C compiler: llama.cpp's graph nodes are matched in Python (every decode pays a call a node)"
            )
            self._python_eval = EvalFn(self._ask_in_python)
            asker = self._python_eval
        self.callback = int(ctypes.cast(asker, ctypes.c_void_p).value or 0)
        self.user_data = ctypes.addressof(self.table)

    @staticmethod
    def _declare(ggml) -> None:
        ggml.ggml_get_name.restype = ctypes.c_char_p
        ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
        ggml.ggml_nelements.restype = ctypes.c_int64
        ggml.ggml_nelements.argtypes = [ctypes.c_void_p]
        ggml.ggml_nbytes.restype = ctypes.c_size_t
        ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
        ggml.ggml_is_contiguous.restype = ctypes.c_bool
        ggml.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
        for name in ("ggml_backend_tensor_get", "ggml_backend_tensor_set"):
            function = getattr(ggml, name)
            function.restype = None
            function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

    def hook(self, names: list[str]) -> None:
        """Stop at these nodes from the next decode on (an empty list: llama.cpp runs undisturbed)."""
        if len(names) > MAX_HOOKS:
            raise ValueError(f"at most {MAX_HOOKS} graph nodes can be hooked at once")
        for i, name in enumerate(names):
            self.table.names[i].value = name.encode()
        self.table.count = len(names)
        self.names = list(names)

    def take_failure(self) -> BaseException | None:
        """The exception a hook raised during the last decode (llama.cpp cannot carry it), once."""
        failure, self.failure = self.failure, None
        return failure

    def _ask_in_python(self, tensor: int, ask: bool, user: int) -> bool:
        if not ask:
            return self._on_data(tensor, self.table.last)
        if not self.names:
            return False
        name = self.ggml.ggml_get_name(tensor).decode()
        if name in self.names:
            self.table.last = self.names.index(name)
            return True
        return False

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
            values = np.empty(int(ggml.ggml_nelements(tensor)), dtype=np.float32)
            size = int(ggml.ggml_nbytes(tensor))
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
