"""Checkpoint directories for model-lifecycle tests: real tiny checkpoints, changed on purpose.

Each is a copy of a tiny checkpoint with one thing made different (a model that never emits
EOS, a quantization config, a broken or truncated weight file, weights whose shapes disagree
with the config, a declared size far beyond any machine), so the server meets the same files a
user could give it.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

SAFETENSORS = "model.safetensors"


def copy_of(model_dir: Path, directory: Path) -> Path:
    """A plain copy of a checkpoint directory."""
    shutil.copytree(model_dir, directory)
    return directory


def edit_json(path: Path, **changes) -> None:
    """Set top-level keys of a JSON file (None is written as null)."""
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def endless(model_dir: Path, directory: Path) -> Path:
    """A copy that declares no end-of-sequence token, so every generation runs to max_tokens."""
    copy_of(model_dir, directory)
    edit_json(directory / "config.json", eos_token_id=None)
    edit_json(directory / "generation_config.json", eos_token_id=None)
    edit_json(directory / "tokenizer_config.json", eos_token=None)
    return directory


def with_config(model_dir: Path, directory: Path, **changes) -> Path:
    """A copy whose config.json has `changes` (e.g. a quantization_config, another
    intermediate_size)."""
    copy_of(model_dir, directory)
    edit_json(directory / "config.json", **changes)
    return directory


def truncated(model_dir: Path, directory: Path) -> Path:
    """A copy whose weight file lost its second half (a copy cut short)."""
    copy_of(model_dir, directory)
    truncate(directory)
    return directory


def truncate(directory: Path, keep: float = 0.5) -> None:
    """Cut the weight file of `directory` short, in place."""
    path = directory / SAFETENSORS
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def garbage_config(model_dir: Path, directory: Path) -> Path:
    """A copy whose config.json is not JSON."""
    copy_of(model_dir, directory)
    (directory / "config.json").write_text("{ this is not json")
    return directory


def huge(model_dir: Path, directory: Path, elements: int) -> Path:
    """A copy whose weight file declares one float32 tensor of `elements` elements; the file is
    sparse (the size its header promises, no data written), so it is whole but fits no machine."""
    copy_of(model_dir, directory)
    header = json.dumps(
        {
            "model.embed_tokens.weight": {
                "dtype": "F32",
                "shape": [elements],
                "data_offsets": [0, elements * 4],
            }
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    path = directory / SAFETENSORS
    with path.open("wb") as handle:
        handle.write(len(header).to_bytes(8, "little"))
        handle.write(header)
        handle.truncate(8 + len(header) + elements * 4)
    return directory


def wide_llama(directory: Path, tokenizer_dir: Path, intermediate_size: int = 1024) -> Path:
    """A 3-layer Llama like the tiny one but with a wider MLP (about 2.6 MB of float32 weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.support.tiny_models import _common, _save

    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(3)
    config = LlamaConfig(
        **{**_common(vocab), "intermediate_size": intermediate_size}, initializer_range=0.2
    )
    return _save(LlamaForCausalLM(config).eval(), tokenizer_dir, directory)


def parameters(directory: Path) -> int:
    """Elements of every tensor in the directory's safetensors file, as the safetensors library
    reads them."""
    from safetensors import safe_open

    with safe_open(str(directory / SAFETENSORS), "pt") as handle:
        return sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())  # noqa: SIM118 (safe_open handles are not iterable)
