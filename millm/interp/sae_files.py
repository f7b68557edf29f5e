"""What every SAE file reader shares: the record the registry keeps (SAEInfo), the content id,
the residual hook names millm steers, and validation that names each problem (a JSON key, a
tensor's shape) in an SAEFormatError the API answers as a 400."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from millm.errors import SAEFormatError
from millm.interp.sae import SAEWeights

LABELS_FILE = "feature_labels.json"
HOOK_NAME = re.compile(r"^blocks\.(\d+)\.hook_resid_(post|pre)$")


def validated(adapter: TypeAdapter, path: Path) -> Any:
    """The JSON file at `path` validated by `adapter`; SAEFormatError naming each problem's
    location."""
    try:
        return adapter.validate_json(path.read_bytes())
    except ValidationError as exc:
        raise SAEFormatError(
            f"{path.name}: " + "; ".join(map(problem, exc.errors(include_url=False)))
        ) from None


def problem(error: ErrorDetails) -> str:
    """One pydantic error as 'd_sae: Input should be greater than 0 (got 0)'."""
    where = ".".join(str(part) for part in error["loc"] if part != "[key]")
    shown = error["type"] not in ("missing", "json_invalid") and not isinstance(
        error["input"], (dict, list)
    )
    return (
        (f"{where}: " if where else "")
        + error["msg"]
        + (f" (got {error['input']!r})" if shown else "")
    )


@dataclass(frozen=True)
class SAEInfo:
    """What the registry records about an SAE file (JSON-serialisable)."""

    id: str
    # "saelens" | "gemma_scope" | "gemma_scope_2" | "llama_scope" | "sparsify" | "transcoder"
    format: str
    path: str  # the SAE's folder, the params.npz file, or the transcoder file
    architecture: str
    d_in: int
    d_sae: int
    layer: int | None
    # "resid_post" | "resid_pre" | "mlp" (a transcoder: reads the MLP input, writes its output)
    hook_point: str
    hook_name: str | None
    k: int | None = None
    model_name: str | None = None
    neuronpedia_id: str | None = None
    has_labels: bool = False
    # Registered by a SAELens release name: the release and the SAE's id in it.
    release: str | None = None
    release_sae_id: str | None = None

    def to_dict(self) -> dict:
        """A plain dict for storage and responses."""
        return asdict(self)


def content_id(path: Path, *also: Path) -> str:
    """sae_ + the first 12 hex digits of the weights file's SHA-256 (and of the files `also` after
    it, for weights kept in several): the same file has the same id anywhere."""
    digest = hashlib.sha256()
    for part in (path, *also):
        with part.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return "sae_" + digest.hexdigest()[:12]


def parse_hook_name(hook_name: str) -> tuple[int, str]:
    """(layer, 'resid_post' | 'resid_pre') for blocks.L.hook_resid_*; anything else is refused."""
    match = HOOK_NAME.match(hook_name)
    if not match:
        raise SAEFormatError(
            f"hook point {hook_name!r} is not supported: millm steers the residual stream "
            "(blocks.L.hook_resid_post or blocks.L.hook_resid_pre)"
        )
    return int(match.group(1)), f"resid_{match.group(2)}"


def expect_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], meaning: str) -> None:
    """A tensor of `shape`, or an SAEFormatError saying what it is instead (transposed, or
    other)."""
    if tuple(tensor.shape) == shape:
        return
    if len(shape) == 2 and tuple(tensor.shape) == shape[::-1]:
        raise SAEFormatError(
            f"{name} is transposed: expected {meaning} = {list(shape)}, got {list(tensor.shape)}"
        )
    raise SAEFormatError(
        f"{name} has shape {list(tensor.shape)}, expected {meaning} = {list(shape)}"
    )


def weights_from(
    tensors: dict[str, torch.Tensor], d_in: int, d_sae: int, source: str
) -> SAEWeights:
    """W_enc, b_enc, W_dec, b_dec checked for presence and shape, as float32."""
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        if name not in tensors:
            raise SAEFormatError(f"{source} has no tensor {name!r} (found: {sorted(tensors)})")
    expect_shape("W_enc", tensors["W_enc"], (d_in, d_sae), "[d_in, d_sae]")
    expect_shape("W_dec", tensors["W_dec"], (d_sae, d_in), "[d_sae, d_in]")
    expect_shape("b_enc", tensors["b_enc"], (d_sae,), "[d_sae]")
    expect_shape("b_dec", tensors["b_dec"], (d_in,), "[d_in]")
    return SAEWeights(
        *(tensors[n].float().contiguous() for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    )


def threshold_from(tensors: dict[str, torch.Tensor], d_sae: int, source: str) -> torch.Tensor:
    """A JumpReLU threshold (or its log), one per feature."""
    if "threshold" in tensors:
        threshold = tensors["threshold"].float()
    elif "log_threshold" in tensors:
        threshold = tensors["log_threshold"].float().exp()
    else:
        raise SAEFormatError(
            f"{source} is a JumpReLU SAE without a 'threshold' (or 'log_threshold') tensor; "
            "treating it as ReLU would give wrong activations"
        )
    expect_shape("threshold", threshold, (d_sae,), "[d_sae]")
    return threshold.contiguous()
