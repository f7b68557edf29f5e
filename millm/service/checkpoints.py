"""What a model's files say before any weight is read: are they whole, how big, how quantized.

Loading a model replaces the loaded one, so everything that can refuse a load is checked here
first, from file headers only (milliseconds, no weight is read): a config that does not parse,
weight files that are missing or shorter than their headers say, a quantization this server
cannot run, and weights that do not fit the device. Only what needs the weights themselves
(shapes that disagree with the config, a tokenizer that cannot be built) can still fail once
the load has begun.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from millm.engine.sources import ModelSource
from millm.errors import (
    InsufficientMemoryToLoad,
    ModelSourceError,
    UnsupportedQuantization,
)

# Bytes per element of the safetensors dtypes (sub-byte and unknown dtypes are not size-checked).
SAFETENSORS_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}
MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
GGUF_MAGIC = b"GGUF"
GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
GGUF_STRING, GGUF_ARRAY = 8, 9


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's figures, read from its headers."""

    parameters: int  # elements of every weight tensor
    stored_bytes: int  # bytes of tensor data in the weight files
    config: dict  # config.json ({} for GGUF files, whose metadata is their own)

    @property
    def quantization(self) -> dict | None:
        """The transformers quantization_config, if the checkpoint has one."""
        return self.config.get("quantization_config") or None


def inspect(source: ModelSource) -> Checkpoint:
    """Read the headers of a checkpoint; ModelSourceError naming the file that is not whole."""
    if source.gguf_file:
        path = source.directory / source.gguf_file
        parameters, stored = _gguf(path)
        return Checkpoint(parameters, stored, {})
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
                names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
                raise ModelSourceError(f"{index_name} in {directory} is not a valid weight index") from None
            missing = [name for name in names if not (directory / name).is_file()]
            if missing:
                raise ModelSourceError(f"{directory} lacks weight files its {index_name} names: {', '.join(missing[:5])}")
            return [directory / name for name in names]
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    if not files:
        raise ModelSourceError(f"{directory} has no weight files (*.safetensors or pytorch_model*.bin)")
    return files


def _stored_width(config: dict) -> int:
    stored = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return 2 if stored in ("float16", "bfloat16") else 4


def _safetensors(path: Path) -> tuple[int, int]:
    """(elements, file bytes) of a safetensors file, after checking it holds what its header says."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 2 or length > min(size - 8, MAX_HEADER_BYTES):
            raise ModelSourceError(f"{path.name} in {path.parent} is not a safetensors file (no valid header)")
        try:
            header = json.loads(handle.read(length))
        except (ValueError, UnicodeDecodeError):
            raise ModelSourceError(f"{path.name} in {path.parent} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ModelSourceError(f"{path.name} in {path.parent} is not a safetensors file (its header is not an object)")
    elements = end_of_data = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            count = math.prod(int(d) for d in shape)
        except (KeyError, TypeError, ValueError):
            raise ModelSourceError(f"{path.name} in {path.parent} has a malformed header entry for {name!r}") from None
        width = SAFETENSORS_BYTES.get(dtype)
        if width is not None and end - begin != count * width:
            raise ModelSourceError(f"{path.name} in {path.parent}: tensor {name!r} takes {end - begin} bytes, its shape needs {count * width}")
        elements += count
        end_of_data = max(end_of_data, end)
    expected = 8 + length + end_of_data
    if size < expected:
        raise ModelSourceError(f"{path.name} in {path.parent} is truncated: its header describes {expected} bytes, the file has {size}")
    return elements, size


def _gguf(path: Path) -> tuple[int, int]:
    """(elements, file bytes) of a GGUF file, from its tensor table (the metadata values are skipped)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = path.stat().st_size
    bad = ModelSourceError(f"{path.name} in {path.parent} is not a whole GGUF file")
    if size < 24:
        raise bad
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            raise ModelSourceError(f"{path.name} in {path.parent} is not a GGUF file")
        try:
            tensors, alignment, offset = _gguf_tensors(data)
            start = -(-offset // alignment) * alignment
            elements = end_of_data = 0
            for count, kind, tensor_offset in tensors:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                elements += count
                end_of_data = max(end_of_data, tensor_offset + count // block * type_size)
        except (struct.error, IndexError, KeyError, ValueError, UnicodeDecodeError):
            raise bad from None
    if size < start + end_of_data:
        raise ModelSourceError(f"{path.name} in {path.parent} is truncated: its tensor table describes {start + end_of_data} bytes, the file has {size}")
    return elements, size


def _gguf_tensors(data) -> tuple[list[tuple[int, int, int]], int, int]:
    """[(elements, ggml type, offset)], the alignment, and where the tensor table ends."""
    _, n_tensors, n_values = struct.unpack_from("<IQQ", data, 4)
    offset, alignment = 24, 32

    def string(at: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", data, at)
        return bytes(data[at + 8: at + 8 + length]).decode("utf-8"), at + 8 + length

    def skip(kind: int, at: int) -> int:
        if kind in GGUF_FIXED:
            return at + GGUF_FIXED[kind]
        if kind == GGUF_STRING:
            (length,) = struct.unpack_from("<Q", data, at)
            return at + 8 + length
        if kind == GGUF_ARRAY:
            inner, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if inner in GGUF_FIXED:
                return at + count * GGUF_FIXED[inner]
            for _ in range(count):
                at = skip(inner, at)
            return at
        raise ValueError(f"unknown GGUF value type {kind}")

    for _ in range(n_values):
        key, offset = string(offset)
        (kind,) = struct.unpack_from("<I", data, offset)
        if key == "general.alignment" and kind == 4:
            (alignment,) = struct.unpack_from("<I", data, offset + 4)
        offset = skip(kind, offset + 4)
    tensors = []
    for _ in range(n_tensors):
        _, offset = string(offset)
        (dims,) = struct.unpack_from("<I", data, offset)
        shape = struct.unpack_from(f"<{dims}Q", data, offset + 4)
        kind, tensor_offset = struct.unpack_from("<IQ", data, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 12
        tensors.append((math.prod(shape), kind, tensor_offset))
    if offset > len(data) or alignment < 1:
        raise ValueError("the tensor table runs past the end of the file")
    return tensors, alignment, offset


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
        raise UnsupportedQuantization(f"model {name!r} has a quantization_config that is not an object", param="model")
    method = str(quant.get("quant_method") or ("bitsandbytes" if quant.get("load_in_4bit") or quant.get("load_in_8bit") else "unnamed"))
    bits = quant.get("bits") or quant.get("weight_bits") or (4 if quant.get("load_in_4bit") else 8 if quant.get("load_in_8bit") else None)
    described = f"{method} {bits}-bit" if isinstance(bits, (int, float)) else method
    if isinstance(bits, (int, float)) and bits <= 2:
        reason = "2-bit and narrower weights have no kernel here"
    else:
        reason = "miLLM's engine runs float weights (and GGUF files, which it dequantises), not pre-quantized transformers checkpoints"
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
        return self.needed_bytes <= room and (self.limit_bytes is None or self.needed_bytes <= self.limit_bytes)

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
        return 2 if torch.cuda.is_bf16_supported() else 4
    return 4 if dtype == "float32" else 2


def free_bytes(device: torch.device) -> int:
    """Memory free on the device now: available RAM for the CPU, the driver's figure for a card."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def human(count: int) -> str:
    """Bytes in binary units, e.g. 1.5 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def check_memory(name: str, needed: int, device: torch.device, reclaimable: int, limit: int | None, loaded: str | None) -> DeviceMemory:
    """The device's figures; 503 insufficient_memory (with them) when the weights do not fit."""
    memory = DeviceMemory(str(device), needed, free_bytes(device), reclaimable, limit)
    if memory.fits:
        return memory
    reasons = []
    if needed > memory.free_bytes + reclaimable:
        released = f" (plus {human(reclaimable)} that unloading {loaded!r} would release)" if loaded and reclaimable else ""
        reasons.append(f"{device} has {human(memory.free_bytes)} free{released}")
    if limit is not None and needed > limit:
        reasons.append(f"MILLM_MEMORY_LIMIT_BYTES caps a model's weights at {limit} bytes ({human(limit)})")
    kept = f"; {loaded!r} stays loaded" if loaded else ""
    raise InsufficientMemoryToLoad(
        f"model {name!r} needs {human(needed)} on {device} for its weights, but {' and '.join(reasons)}{kept}",
        [memory.to_dict()],
    )
