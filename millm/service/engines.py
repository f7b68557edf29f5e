"""Which engine runs a model: transformers or llama.cpp, from --engine and the model's file.

auto keeps every feature where it can: transformers (residual reads, monitoring, probes,
clamps, every SAE layer) whenever the weights fit dequantised, and llama.cpp for a .gguf file
whose dequantised copy would not fit in memory but whose file does (a Llama-3.1-8B Q4_K_M is
4.9 GB as a file and 32 GB in float32). Choosing by memory rather than by file type means the
README's demo, a 135M GGUF file, keeps everything the README shows.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from millm.engine.sources import ModelSource
from millm.errors import ModelSourceError

TRANSFORMERS, LLAMACPP = "transformers", "llama.cpp"
INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" pip install "millm[gguf]" (./scripts/setup.sh does it)'


def llamacpp_installed() -> bool:
    """Whether llama-cpp-python can be imported here."""
    return importlib.util.find_spec("llama_cpp") is not None


def check_engine_setting(engine: str) -> None:
    """At start-up: --engine llama.cpp needs llama-cpp-python (a clear message saying how to get it)."""
    if engine == LLAMACPP and not llamacpp_installed():
        raise ModelSourceError(f"--engine llama.cpp needs llama-cpp-python, which is not installed: {INSTALL}")


def choose_engine(setting: str, source: ModelSource, fits: Callable[[int], bool], dequantised_bytes: int) -> str:
    """The engine for `source` under --engine `setting`; `fits(n)` says whether n bytes of weights fit."""
    if setting == TRANSFORMERS:
        return TRANSFORMERS
    if setting == LLAMACPP:
        if not source.gguf_file:
            raise ModelSourceError(f"--engine llama.cpp runs .gguf files, and {source.reference!r} is not one")
        return LLAMACPP
    if source.gguf_file and llamacpp_installed() and not fits(dequantised_bytes):
        return LLAMACPP
    return TRANSFORMERS
