"""Which engine runs a model: transformers or llama.cpp, from --engine and the model's file.

auto runs a .gguf file on llama.cpp whenever llama-cpp-python is installed: its kernels keep
the file quantised and decode several times faster, and millm reads, steers, probes, caches
prefixes and runs the logit lens inside its graph, so nothing a chat or a discovery job uses
is lost. Checkpoints, GGUF files on a server without llama-cpp-python, and GGUF files bound
for a GPU that llama-cpp-python was not built for (a CPU build beside a CUDA torch) run on
transformers.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from millm.engine.runner_llamacpp import MICRO_BATCH
from millm.engine.sources import ModelSource
from millm.errors import ModelSourceError
from millm.kernel.model.checkpoints import (
    Checkpoint,
    DeviceMemory,
    GGUFShape,
    element_bytes,
    free_bytes,
)
from millm.settings import Settings

TRANSFORMERS, LLAMACPP = "transformers", "llama.cpp"
INSTALL = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" pip install "millm[gguf]" '
    "(./scripts/setup.sh does it)"
)


def llamacpp_installed() -> bool:
    """Whether llama-cpp-python can be imported here."""
    return importlib.util.find_spec("llama_cpp") is not None


def check_engine_setting(engine: str) -> None:
    """At start-up: --engine llama.cpp needs llama-cpp-python (a clear message saying how to get
    it)."""
    if engine == LLAMACPP and not llamacpp_installed():
        raise ModelSourceError(
            f"--engine llama.cpp needs llama-cpp-python, which is not installed: {INSTALL}"
        )


def llamacpp_offloads() -> bool:
    """Whether this llama-cpp-python build runs layers on a GPU (a CUDA build)."""
    from millm.engine.runner_llamacpp import bindings

    return bool(bindings().llama_supports_gpu_offload())


def choose_engine(
    setting: str,
    source: ModelSource,
    device: torch.device | None = None,
    installed: Callable[[], bool] = llamacpp_installed,
    offloads: Callable[[], bool] = llamacpp_offloads,
) -> str:
    """The engine for `source` under --engine `setting` on `device` (`installed`: whether
    llama-cpp-python is; `offloads`: whether its build uses a GPU)."""
    if setting == TRANSFORMERS:
        return TRANSFORMERS
    if setting == LLAMACPP:
        if not source.gguf_file:
            raise ModelSourceError(
                f"--engine llama.cpp runs .gguf files, and {source.reference!r} is not one"
            )
        return LLAMACPP
    if source.gguf_file and installed():
        on_gpu = device is not None and device.type != "cpu"
        return LLAMACPP if not on_gpu or offloads() else TRANSFORMERS
    return TRANSFORMERS


# A window lowered to fit memory stops here: below it a chat with a system prompt and a long
# answer no longer fits, and the user is better told to free memory or pick a smaller file.
MIN_CONTEXT = 4096


@dataclass(frozen=True)
class LlamaCppSizing:
    """What a GGUF file needs on llama.cpp, whose buffers are allocated whole at load."""

    context: int | None  # the window to load with; None: the model's own (its metadata names none)
    needed: int  # bytes: the file, the KV cache for `context`, and one micro-batch of logits
    lowered_from: int | None  # the model's own window when it had to be lowered to fit

    def describe(self) -> str:
        """What `needed` holds, for the insufficient-memory message."""
        return f"its file and a {self.context}-token KV cache" if self.context else "its file"


def llamacpp_sizing(
    file_bytes: int,
    shape: GGUFShape | None,
    asked: int | None,
    exact_kv: bool,
    fits: Callable[[int], bool],
) -> LlamaCppSizing:
    """The window and bytes a GGUF file gets on llama.cpp. An asked window (--max-model-len) is
    kept as asked; otherwise the model's own, halved (not below MIN_CONTEXT) until its KV cache fits
    beside the file: a Llama-3.1-8B's 131,072-token window alone is a 16 GiB float16 KV cache."""
    per_token = (shape.kv_elements_per_token or 0) * (4 if exact_kv else 2) if shape else 0
    output = MICRO_BATCH * (shape.vocab_size or 0) * 4 if shape else 0

    def needed(context: int | None) -> int:
        return file_bytes + (context or 0) * per_token + output

    native = shape.context_length if shape else None
    if asked is not None or native is None:
        return LlamaCppSizing(asked, needed(asked), None)
    context = native
    while context > MIN_CONTEXT and not fits(needed(context)):
        context = max(MIN_CONTEXT, context // 2)
    return LlamaCppSizing(context, needed(context), native if context != native else None)


@dataclass(frozen=True)
class LoadPlan:
    """How a model would be loaded now: its engine, the bytes to check, the window to load with."""

    engine: str
    needed: int  # bytes the load needs on the device
    what: str  # what `needed` holds, for the insufficient-memory message
    window: int | None  # --max-model-len, or the llama.cpp window that fits; None: the model's own
    lowered_from: int | None = None  # the model's own window when it had to be lowered to fit


def plan_load(
    settings: Settings,
    source: ModelSource,
    checkpoint: Checkpoint,
    device: torch.device,
    reclaimable: int,
    window: int | None,
) -> LoadPlan:
    """--engine applied to `source` and what the load needs: dequantised weights on transformers;
    on llama.cpp the file, its KV cache and logits (the window lowered to fit when not asked)."""
    limit = settings.memory_limit_bytes

    def fits(n: int) -> bool:
        return DeviceMemory(str(device), n, free_bytes(device), reclaimable, limit).fits

    engine = choose_engine(settings.engine, source, device)
    if engine == TRANSFORMERS:
        weights = checkpoint.parameters * element_bytes(device, settings.dtype)
        return LoadPlan(engine, weights, "its weights", window)
    sizing = llamacpp_sizing(
        checkpoint.stored_bytes, checkpoint.gguf, window, settings.dtype == "float32", fits
    )
    return LoadPlan(engine, sizing.needed, sizing.describe(), sizing.context, sizing.lowered_from)
