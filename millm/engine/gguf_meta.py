"""What a GGUF file's header says about its weights, and its header parsed once.

gguf-py's GGUFReader walks every metadata value one by one, so a file with a large vocabulary
(Gemma 3's 262k tokens) takes seconds to open, and loading one GGUF checkpoint opens it several
times: transformers reads it for the config, the weights and the tokenizer, and millm for its
facts. `reader(path)` keeps the last few parsed headers (by path, size and modification time),
and `readers_shared()` hands the same ones to transformers while a conversion runs."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HEADERS_KEPT = 2  # parsed headers kept per process (a 262k vocabulary is ~100 MB of small arrays)
_sharing = threading.Lock()
_sharers = 0  # conversions running with transformers' readers shared


@functools.cache
def _shared_reader_class() -> Any:
    """GGUFReader, made once per file: constructing it again returns the kept instance."""
    import gguf

    class SharedReader(gguf.GGUFReader):
        """A GGUFReader whose parsed header is kept and handed to the next reader of the file."""

        _kept: OrderedDict[tuple, SharedReader] = OrderedDict()
        _lock = threading.Lock()

        def __new__(cls, path, mode="r"):
            stat = Path(path).stat()
            key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, mode)
            with cls._lock:
                found = cls._kept.get(key)
                if found is not None:
                    cls._kept.move_to_end(key)
                    return found
            made = super().__new__(cls)
            super(SharedReader, made).__init__(path, mode)  # GGUFReader parses here
            with cls._lock:
                cls._kept[key] = made
                while len(cls._kept) > HEADERS_KEPT:
                    cls._kept.popitem(last=False)
            return made

        def __init__(self, path, mode="r"):
            pass  # parsed once, in __new__

    return SharedReader


def reader(path: Path):
    """The file's parsed header (and a map of its tensors), parsed once while it is unchanged."""
    return _shared_reader_class()(str(path))


@contextmanager
def readers_shared() -> Iterator[None]:
    """While inside, transformers' GGUF loading (which constructs `gguf.GGUFReader` at each call)
    gets the kept readers too."""
    import gguf

    global _sharers
    shared = _shared_reader_class()
    with _sharing:
        if _sharers == 0:
            gguf.GGUFReader = shared  # type: ignore[misc]  # the class transformers constructs
        _sharers += 1
    try:
        yield
    finally:
        with _sharing:
            _sharers -= 1
            if _sharers == 0:
                gguf.GGUFReader = shared.__bases__[0]  # type: ignore[misc]  # gguf-py's own again


def gguf_file_type(path: Path) -> str | None:
    """The quantization named by a GGUF file's general.file_type (e.g. Q4_1), if recorded."""
    import gguf

    field_ = reader(path).fields.get("general.file_type")
    if field_ is None:
        return None
    value = int(field_.contents())
    try:
        name = gguf.LlamaFileType(value).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")
