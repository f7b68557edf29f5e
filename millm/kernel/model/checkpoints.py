"""What a model's files say before any weight is read: are they whole, how big, how quantized.

Loading a model replaces the loaded one, so everything that can refuse a load is checked here
first, from file headers only, as the safetensors and gguf libraries read them (no weight is
read; milliseconds, or seconds for a GGUF file's vocabulary): a config that does not parse,
weight files that are missing or shorter than their headers say, a quantization this server
cannot run, and weights that do not fit the device. Only what needs the weights themselves
(shapes that disagree with the config, a tokenizer that cannot be built) can still fail once
the load has begun.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from millm.engine.gguf_meta import reader
from millm.engine.loader import cuda_bf16
from millm.engine.sources import ModelSource
from millm.errors import (
    InsufficientMemoryToLoad,
    ModelSourceError,
    UnsupportedQuantization,
)

# How the safetensors library words a file whose length is not what its header says (newer
# releases, then older ones).
SAFETENSORS_WRONG_LENGTH = (
    "invalid header length",
    "incomplete metadata",
    "InvalidHeaderLength",
    "MetadataIncompleteBuffer",
)


@dataclass(frozen=True)
class GGUFShape:
    """What sizes llama.cpp's buffers for a GGUF file, from its metadata: the trained window,
    the key and value elements one token keeps over all layers, and the vocabulary."""

    context_length: int | None
    kv_elements_per_token: int | None
    vocab_size: int | None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's figures, read from its headers."""

    parameters: int  # elements of every weight tensor
    stored_bytes: int  # bytes of tensor data in the weight files
    config: dict  # config.json ({} for GGUF files, whose metadata is their own)
    gguf: GGUFShape | None = None  # what a GGUF file's metadata says about its KV cache and output

    @property
    def quantization(self) -> dict | None:
        """The transformers quantization_config, if the checkpoint has one."""
        return self.config.get("quantization_config") or None


def inspect(source: ModelSource) -> Checkpoint:
    """Read the headers of a checkpoint; ModelSourceError naming the file that is not whole."""
    if source.gguf_file:
        path = source.directory / source.gguf_file
        stat = path.stat()
        parameters, shape = _gguf_read(path, stat.st_size, stat.st_mtime_ns)
        return Checkpoint(parameters, stat.st_size, {}, shape)
    config = _config(source.directory)
    parameters = stored = 0
    for path in _weight_files(source.directory):
        if path.suffix == ".safetensors":
            count, size = _safetensors(path)
        else:  # a pickle: no header to read, so count its bytes at the config's dtype
            size = path.stat().st_size
            count = size // _stored_width(config)
        parameters += count
        stored += size
    return Checkpoint(parameters, stored, config)


def _config(directory: Path) -> dict:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelSourceError(f"{directory} has no config.json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelSourceError(f"config.json in {directory} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ModelSourceError(f"config.json in {directory} is not a JSON object")
    return config


def _weight_files(directory: Path) -> list[Path]:
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            try:
                names = sorted(
                    set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
                )
            except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
                raise ModelSourceError(
                    f"{index_name} in {directory} is not a valid weight index"
                ) from None
            missing = [name for name in names if not (directory / name).is_file()]
            if missing:
                raise ModelSourceError(
                    f"{directory} lacks weight files its {index_name} names: "
                    f"{', '.join(missing[:5])}"
                )
            return [directory / name for name in names]
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    if not files:
        raise ModelSourceError(
            f"{directory} has no weight files (*.safetensors or pytorch_model*.bin)"
        )
    return files


def _stored_width(config: dict) -> int:
    stored = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return 2 if stored in ("float16", "bfloat16") else 4


def _safetensors(path: Path) -> tuple[int, int]:
    """(elements, file bytes) of a safetensors file, after the library checked it holds what its
    header says."""
    from safetensors import SafetensorError, safe_open

    size = path.stat().st_size
    # safe_open maps the file and checks its header against the file's length; no tensor is read
    try:
        with safe_open(str(path), "np") as handle:
            names = handle.keys()  # safe_open is not a mapping: keys() is how it lists tensors
            return sum(math.prod(handle.get_slice(name).get_shape()) for name in names), size
    except SafetensorError as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        if reason.startswith(SAFETENSORS_WRONG_LENGTH):
            raise ModelSourceError(
                f"{path.name} in {path.parent} is truncated: the file has {size} bytes, not the "
                "size its header describes"
            ) from None
        raise ModelSourceError(
            f"{path.name} in {path.parent} is not a valid safetensors file ({reason})"
        ) from None


@functools.lru_cache(maxsize=8)
def _gguf_read(path: Path, size: int, mtime_ns: int) -> tuple[int, GGUFShape]:
    """(weight elements, shape) of a GGUF file, from its tensor table and metadata."""
    # A file that has not changed since (same size and mtime) is read once per process, not at
    # registering and again at every load; the header is gguf_meta's shared parse (it maps the
    # file and reads no tensor data).
    try:
        header = reader(path)
        return sum(int(tensor.n_elements) for tensor in header.tensors), _gguf_shape(header)
    except (ValueError, IndexError, KeyError, OverflowError) as exc:
        with path.open("rb") as handle:
            if handle.read(4) != b"GGUF":
                raise ModelSourceError(f"{path.name} in {path.parent} is not a GGUF file") from None
        # The reader fails on a tensor whose data runs past the end of the file, or on a table it
        # cannot walk.
        raise ModelSourceError(
            f"{path.name} in {path.parent} is not a whole GGUF file (truncated or corrupt: {exc})"
        ) from None


def _gguf_shape(reader) -> GGUFShape:
    """The KV cache's and the output's figures from llama.cpp's metadata keys ({arch}.block_count,
    ...); None where the file does not say (then nothing is counted for it)."""

    def value(key: str):
        field = reader.fields.get(key)
        return field.contents() if field is not None else None

    arch = value("general.architecture")
    layers, heads, kv_heads, width = (
        value(f"{arch}.{key}")
        for key in (
            "block_count",
            "attention.head_count",
            "attention.head_count_kv",
            "embedding_length",
        )
    )
    if isinstance(heads, list):  # per-layer counts (some architectures vary them)
        heads = max(heads) or None
    per_layer = (
        kv_heads
        if isinstance(kv_heads, list)
        else [kv_heads if kv_heads is not None else heads] * (layers or 0)
    )
    key_length = value(f"{arch}.attention.key_length") or (
        width // heads if width and heads else None
    )
    value_length = value(f"{arch}.attention.value_length") or key_length
    kv = sum(int(n) * (key_length + value_length) for n in per_layer if n) if key_length else None
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = value(f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None)
    context = value(f"{arch}.context_length")
    return GGUFShape(int(context) if context else None, kv or None, int(vocab) if vocab else None)


def check_quantization(name: str, checkpoint: Checkpoint) -> None:
    """400 unsupported_quantization for a transformers checkpoint with quantized weights.

    The engine builds its own kernels from float weights (GGUF files are dequantised first), so a
    pre-quantized transformers checkpoint (bitsandbytes, GPTQ, AWQ, ...) cannot run here; the
    message says which method and width the checkpoint uses, and what to serve instead.
    """
    quant = checkpoint.quantization
    if quant is None:
        return
    if not isinstance(quant, dict):
        raise UnsupportedQuantization(
            f"model {name!r} has a quantization_config that is not an object", param="model"
        )
    method = str(
        quant.get("quant_method")
        or ("bitsandbytes" if quant.get("load_in_4bit") or quant.get("load_in_8bit") else "unnamed")
    )
    bits = (
        quant.get("bits")
        or quant.get("weight_bits")
        or (4 if quant.get("load_in_4bit") else 8 if quant.get("load_in_8bit") else None)
    )
    described = f"{method} {bits}-bit" if isinstance(bits, (int, float)) else method
    if isinstance(bits, (int, float)) and bits <= 2:
        reason = "2-bit and narrower weights have no kernel here"
    else:
        reason = (
            "miLLM's engine runs float weights (and GGUF files, which it dequantises), not "
            "pre-quantized transformers checkpoints"
        )
    raise UnsupportedQuantization(
        f"model {name!r} is quantized as {described}, which this server cannot run: {reason}; "
        "serve a float (or GGUF) copy of it instead",
        param="model",
    )


@dataclass(frozen=True)
class DeviceMemory:
    """The figures of one device for one load."""

    device: str
    needed_bytes: int  # the new model's weights at the compute dtype
    free_bytes: int  # free now
    reclaimable_bytes: int  # held by the loaded model, which is unloaded first
    limit_bytes: int | None  # MILLM_MEMORY_LIMIT_BYTES

    @property
    def fits(self) -> bool:
        """Whether the weights fit beside what stays on the device (and under the cap)."""
        room = self.free_bytes + self.reclaimable_bytes
        return self.needed_bytes <= room and (
            self.limit_bytes is None or self.needed_bytes <= self.limit_bytes
        )

    def to_dict(self) -> dict:
        """JSON figures, as the error and the model view report them."""
        return {
            "device": self.device,
            "needed_bytes": self.needed_bytes,
            "free_bytes": self.free_bytes,
            "reclaimable_bytes": self.reclaimable_bytes,
            "limit_bytes": self.limit_bytes,
        }


def element_bytes(device: torch.device, dtype: str) -> int:
    """Bytes per weight once loaded: the CPU loads float32 (its kernels are built from it);
    a card holds the compute dtype (auto = bfloat16 where supported)."""
    if device.type == "cpu":
        return 4
    if dtype == "auto":
        return 2 if cuda_bf16(device) else 4
    return 4 if dtype == "float32" else 2


def free_bytes(device: torch.device) -> int:
    """Memory free on the device now: available RAM for the CPU, the driver's figure for a card."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


PREFIX_CACHE_SHARE, PREFIX_CACHE_MOST = 8, 4 << 30


def prefix_cache_budget(configured: int | None, device: torch.device) -> int:
    """PREFIX_CACHE_BYTES, or by default an eighth of what the device has free now (at most 4
    GiB)."""
    if configured is not None:
        return configured
    return min(PREFIX_CACHE_MOST, free_bytes(device) // PREFIX_CACHE_SHARE)


def human(count: int) -> str:
    """Bytes in binary units, e.g. 1.5 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def check_memory(
    name: str,
    needed: int,
    device: torch.device,
    reclaimable: int,
    limit: int | None,
    loaded: str | None,
    what: str = "its weights",
) -> DeviceMemory:
    """The device's figures; 503 insufficient_memory (with them) when `what` (the weights) does
    not fit."""
    memory = DeviceMemory(str(device), needed, free_bytes(device), reclaimable, limit)
    if memory.fits:
        return memory
    reasons = []
    if needed > memory.free_bytes + reclaimable:
        released = (
            f" (plus {human(reclaimable)} that unloading {loaded!r} would release)"
            if loaded and reclaimable
            else ""
        )
        reasons.append(f"{device} has {human(memory.free_bytes)} free{released}")
    if limit is not None and needed > limit:
        reasons.append(
            f"MILLM_MEMORY_LIMIT_BYTES caps a model's weights at {limit} bytes ({human(limit)})"
        )
    kept = f"; {loaded!r} stays loaded" if loaded else ""
    raise InsufficientMemoryToLoad(
        f"model {name!r} needs {human(needed)} on {device} for {what}, but "
        f"{' and '.join(reasons)}{kept}",
        [memory.to_dict()],
    )
