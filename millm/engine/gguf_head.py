"""A GGUF file's final norm and output head as torch tensors, for the logit lens on llama.cpp.

llama.cpp applies them only to the last block's output; the lens applies them to every chosen
block's, so millm reads the two tensors from the file (gguf-py, the reader transformers uses)
and dequantises them to float32, once, on first use. The norm is the file's own: an RMS norm,
or a layer norm where the file has its bias (llama.cpp's converter already folds Gemma's
`1 + weight` into the stored weight). A tied head is the token embeddings.

Parsing a GGUF file's header takes seconds (its vocabulary is thousands of strings), so where
the tensors lie in the file is read once with the file's other metadata (`head_locations`, kept
in the loader's cache) and the first lens request maps just those bytes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from millm.engine.families import soft_capped
from millm.engine.gguf_meta import reader


@dataclass(frozen=True)
class HeadTensors:
    """The dequantised tensors: norm weight (and bias), head `[V, d]` (and bias)."""

    norm_weight: torch.Tensor
    norm_bias: torch.Tensor | None
    head: torch.Tensor
    head_bias: torch.Tensor | None


HEAD_TENSORS = (
    "output_norm.weight",
    "output_norm.bias",
    "output.weight",
    "output.bias",
    "token_embd.weight",
)


def head_locations(path: Path) -> dict[str, dict]:
    """Where the final norm's and head's tensors lie in the GGUF file: per name its data offset,
    ggml type, and the numpy dtype and shape gguf-py reads its bytes as."""
    return {
        t.name: {
            "offset": int(t.data_offset),
            "type": int(t.tensor_type),
            "dtype": t.data.dtype.str,
            "shape": list(t.data.shape),
        }
        for t in reader(path).tensors
        if t.name in HEAD_TENSORS
    }


def read_head(path: Path, locations: dict[str, dict] | None = None) -> HeadTensors:
    """The final norm and output head of the GGUF file at `path`, dequantised to float32
    (`locations`: head_locations(path), read now when not given)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    places = locations if locations is not None else head_locations(path)

    def tensor(name: str) -> torch.Tensor | None:
        place = places.get(name)
        if place is None:
            return None
        data = np.memmap(
            path, dtype=np.dtype(place["dtype"]), mode="r", offset=place["offset"],
            shape=tuple(place["shape"]),
        )  # fmt: skip
        values = dequantize(data, GGMLQuantizationType(place["type"]))
        return torch.from_numpy(np.array(values, dtype=np.float32))

    norm, head = tensor("output_norm.weight"), tensor("output.weight")
    if head is None:
        head = tensor("token_embd.weight")  # tied embeddings
    if norm is None or head is None:
        raise ValueError(f"{path.name} names no output_norm or output head tensor")
    return HeadTensors(norm, tensor("output_norm.bias"), head, tensor("output.bias"))


class GGUFHead:
    """The final norm and head of one GGUF file, read on first use (the lens service reads them
    on a worker thread before its passes) and kept."""

    def __init__(
        self, path: Path, eps: float, softcap: float | None, locations: dict[str, dict] | None
    ):
        self.path, self.eps, self.softcap, self.locations = path, eps, softcap, locations
        self._tensors: HeadTensors | None = None
        self._lock = threading.Lock()

    def tensors(self) -> HeadTensors:
        """The dequantised tensors, read once."""
        with self._lock:
            if self._tensors is None:
                self._tensors = read_head(self.path, self.locations)
            return self._tensors

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The model's final norm over the last dimension, in float32."""
        t = self.tensors()
        x = x.float()
        if t.norm_bias is not None:
            return torch.nn.functional.layer_norm(
                x, (x.shape[-1],), t.norm_weight, t.norm_bias, self.eps
            )
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * t.norm_weight

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of final-normalised hidden states (the family's final soft-cap
        applied)."""
        t = self.tensors()
        logits = torch.nn.functional.linear(hidden.float(), t.head, t.head_bias)
        return soft_capped(logits, self.softcap)
