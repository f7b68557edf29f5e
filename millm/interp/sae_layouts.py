"""The layouts published SAE families use on the hub, read as they are (no conversion step):

- Gemma Scope: `params.npz` (JumpReLU), the layer in the path (`layer_12/width_16k/...`);
- Gemma Scope 2: `params.safetensors` (+ `config.json`), the hook in its folder's name;
- Llama Scope: `hyperparams.json` + `checkpoints/final.safetensors` (JumpReLU with one threshold,
  trained on inputs scaled to a norm of sqrt(d_in), which is folded into the weights);
- EleutherAI sparsify: `cfg.json` + `sae.safetensors` (TopK), the layer in the folder's name.

Each is read the way SAELens's own loader for it reads it, so a feature index means what it means
on Neuronpedia. A file for a point millm cannot steer (an MLP or attention output, a transcoder, the
embeddings) is refused with the reason.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from millm.errors import SAEFormatError
from millm.interp.sae import SAE, JumpReLUSAE, TopKSAE
from millm.interp.sae_files import (
    LABELS_FILE,
    SAEInfo,
    content_id,
    parse_hook_name,
    threshold_from,
    validated,
    weights_from,
)

GEMMA_SCOPE_FILE = "params.npz"
GEMMA_SCOPE_2_FILE = "params.safetensors"
GEMMA_SCOPE_2_CONFIG = "config.json"
LLAMA_SCOPE_CONFIG = "hyperparams.json"
LLAMA_SCOPE_WEIGHTS = Path("checkpoints") / "final.safetensors"
SPARSIFY_CONFIG = "cfg.json"
SPARSIFY_WEIGHTS = "sae.safetensors"
# The hub files each layout needs, as glob patterns inside an SAE's folder (the hub fetch asks for
# these).
LAYOUT_FILES = [
    GEMMA_SCOPE_FILE,
    GEMMA_SCOPE_2_FILE,
    GEMMA_SCOPE_2_CONFIG,
    LLAMA_SCOPE_CONFIG,
    str(LLAMA_SCOPE_WEIGHTS),
    SPARSIFY_WEIGHTS,
]
LAYER = re.compile(r"layer_(\d+)")
# Gemma Scope's repositories name what their SAEs read: -res (the residual), -mlp, -att.
GEMMA_SCOPE_SITE = re.compile(r"gemma-scope-[^/]*?-(res|mlp|att|transcoders)\b")
NOT_STEERED = (
    "millm steers and reads the residual stream; an SAE of {what} cannot be attached "
    "(transcoders are read as circuit-tracer sets, see the attribution docs)"
)


def read_layout(path: Path) -> tuple[SAEInfo, SAE] | None:
    """The SAE at `path` if it is in one of these layouts, else None (a SAELens folder, say)."""
    if path.is_file() and path.suffix == ".npz":
        return read_gemma_scope(path)
    if not path.is_dir():
        return None
    if (path / SPARSIFY_WEIGHTS).is_file():
        return read_sparsify(path)
    if (path / GEMMA_SCOPE_2_FILE).is_file():
        return read_gemma_scope_2(path)
    if (path / LLAMA_SCOPE_CONFIG).is_file():
        return read_llama_scope(path)
    if (path / GEMMA_SCOPE_FILE).is_file():
        return read_gemma_scope(path / GEMMA_SCOPE_FILE)
    return None


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise SAEFormatError(f"{path.parent} has no {path.name}")
    try:
        return {name: tensor.float() for name, tensor in load_file(str(path)).items()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise SAEFormatError(f"{path.name} is not a readable safetensors file: {exc}") from None


def _gemma_site(path: Path) -> None:
    """Refuse a Gemma Scope SAE of an MLP or attention output (its repository's name says which)."""
    site = GEMMA_SCOPE_SITE.search(str(path).replace("--", "/"))
    if site is not None and site.group(1) != "res":
        what = {"mlp": "an MLP output", "att": "attention outputs", "transcoders": "a transcoder"}
        raise SAEFormatError(f"{path.name}: " + NOT_STEERED.format(what=what[site.group(1)]))


def _layer_in(path: Path) -> int | None:
    found = LAYER.findall(str(path))
    return int(found[-1]) if found else None


def _info(
    path: Path, weights_file: Path, fmt: str, sae: SAE, layer: int | None, **extra: Any
) -> SAEInfo:
    return SAEInfo(
        id=content_id(weights_file),
        format=fmt,
        path=str(path),
        architecture=sae.architecture,
        d_in=sae.d_in,
        d_sae=sae.d_sae,
        layer=layer,
        hook_point="resid_post",
        hook_name=None if layer is None else f"blocks.{layer}.hook_resid_post",
        has_labels=((path if path.is_dir() else path.parent) / LABELS_FILE).is_file(),
        **extra,
    )


def read_gemma_scope(path: Path) -> tuple[SAEInfo, SAE]:
    """A Gemma Scope params.npz (JumpReLU); width from the shapes, layer from the path's layer_N."""
    _gemma_site(path)
    try:
        with np.load(path) as archive:
            arrays = {
                name: torch.from_numpy(np.asarray(archive[name], dtype=np.float32))
                for name in archive.files
            }
    except (OSError, ValueError) as exc:
        raise SAEFormatError(f"{path.name} is not a readable .npz file: {exc}") from None
    tensors = {
        {"w_enc": "W_enc", "w_dec": "W_dec"}.get(name, name): value
        for name, value in arrays.items()
    }
    for name in ("b_enc", "b_dec"):
        if name not in tensors:
            raise SAEFormatError(f"{path.name} has no array {name!r} (found: {sorted(arrays)})")
    d_in, d_sae = int(tensors["b_dec"].shape[0]), int(tensors["b_enc"].shape[0])
    weights = weights_from(tensors, d_in, d_sae, path.name)
    sae = JumpReLUSAE(
        weights, threshold_from(tensors, d_sae, path.name), apply_b_dec_to_input=False
    )
    # A folder renamed by hand names no layer: registered all the same, it needs `layer` to attach.
    return _info(path, path, "gemma_scope", sae, _layer_in(path)), sae


class GemmaScope2Config(BaseModel):
    """The keys of a Gemma Scope 2 config.json millm uses (its HF hook point names the site)."""

    model_config = ConfigDict(extra="allow")
    architecture: str = "jump_relu"
    hf_hook_point_in: str | None = None
    model_name: str | None = None


HF_RESIDUAL = re.compile(r"^model\.layers\.(\d+)\.output$")


def read_gemma_scope_2(directory: Path) -> tuple[SAEInfo, SAE]:
    """A Gemma Scope 2 folder: params.safetensors (w_enc, w_dec, b_enc, b_dec, threshold)."""
    _gemma_site(directory)
    config = GemmaScope2Config()
    if (directory / GEMMA_SCOPE_2_CONFIG).is_file():
        config = validated(TypeAdapter(GemmaScope2Config), directory / GEMMA_SCOPE_2_CONFIG)
    if config.architecture != "jump_relu":
        raise SAEFormatError(
            f"{GEMMA_SCOPE_2_CONFIG}: architecture {config.architecture!r} is not jump_relu"
        )
    hook = config.hf_hook_point_in
    residual = HF_RESIDUAL.match(hook) if hook else None
    if hook and residual is None:
        raise SAEFormatError(f"{directory.name} reads {hook}: " + NOT_STEERED.format(what="it"))
    for site in ("attn_out", "mlp_out", "transcoder", "clt"):
        if hook is None and site in directory.as_posix():
            raise SAEFormatError(f"{directory.name}: " + NOT_STEERED.format(what=site))
    layer = int(residual.group(1)) if residual else _layer_in(directory)
    if layer is None:
        raise SAEFormatError(
            f"{directory} names no layer (layer_N in its folder, or a config.json)"
        )
    tensors = _load_safetensors(directory / GEMMA_SCOPE_2_FILE)
    tensors = {{"w_enc": "W_enc", "w_dec": "W_dec"}.get(k, k): v for k, v in tensors.items()}
    if "b_enc" not in tensors or "b_dec" not in tensors:
        raise SAEFormatError(
            f"{GEMMA_SCOPE_2_FILE} has no b_enc or b_dec (found: {sorted(tensors)})"
        )
    d_in, d_sae = int(tensors["b_dec"].shape[0]), int(tensors["b_enc"].shape[0])
    weights = weights_from(tensors, d_in, d_sae, GEMMA_SCOPE_2_FILE)
    sae = JumpReLUSAE(
        weights, threshold_from(tensors, d_sae, GEMMA_SCOPE_2_FILE), apply_b_dec_to_input=False
    )
    info = _info(
        directory,
        directory / GEMMA_SCOPE_2_FILE,
        "gemma_scope_2",
        sae,
        layer,
        model_name=config.model_name,
    )
    return info, sae


class LlamaScopeConfig(BaseModel):
    """The keys of a Llama Scope hyperparams.json millm uses."""

    model_config = ConfigDict(extra="allow")
    d_model: int = Field(gt=0)
    d_sae: int = Field(gt=0)
    hook_point_in: str
    jump_relu_threshold: float
    dataset_average_activation_norm: dict[str, float]


def read_llama_scope(directory: Path) -> tuple[SAEInfo, SAE]:
    """A Llama Scope folder. Its SAE saw inputs scaled by sqrt(d_in) / (their average norm); as
    SAELens does, the threshold is scaled by that factor and the factor folded into the weights."""
    config: LlamaScopeConfig = validated(
        TypeAdapter(LlamaScopeConfig), directory / LLAMA_SCOPE_CONFIG
    )
    layer, point = parse_hook_name(config.hook_point_in)
    if point != "resid_post":
        raise SAEFormatError(
            f"{LLAMA_SCOPE_CONFIG}: hook_point_in {config.hook_point_in!r} is not a resid_post"
        )
    average = config.dataset_average_activation_norm.get("in")
    if not average or average <= 0:
        raise SAEFormatError(
            f"{LLAMA_SCOPE_CONFIG}: dataset_average_activation_norm.in must be a positive number"
        )
    factor = math.sqrt(config.d_model) / average
    raw = _load_safetensors(directory / LLAMA_SCOPE_WEIGHTS)
    names = {"encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"}
    if not names <= raw.keys():
        raise SAEFormatError(
            f"{LLAMA_SCOPE_WEIGHTS} lacks {sorted(names - raw.keys())} (found: {sorted(raw)})"
        )
    tensors = {
        "W_enc": raw["encoder.weight"].T * factor,
        "b_enc": raw["encoder.bias"],
        "W_dec": raw["decoder.weight"].T / factor,
        "b_dec": raw["decoder.bias"] / factor,
    }
    weights = weights_from(tensors, config.d_model, config.d_sae, str(LLAMA_SCOPE_WEIGHTS))
    threshold = torch.full((config.d_sae,), config.jump_relu_threshold * factor)
    sae = JumpReLUSAE(weights, threshold, apply_b_dec_to_input=False)
    return _info(directory, directory / LLAMA_SCOPE_WEIGHTS, "llama_scope", sae, layer), sae


class SparsifyConfig(BaseModel):
    """The keys of a sparsify cfg.json millm uses."""

    model_config = ConfigDict(extra="allow")
    d_in: int = Field(gt=0)
    k: int = Field(gt=0)
    num_latents: int = 0
    expansion_factor: int = 32
    activation: str = "topk"
    transcode: bool = False
    skip_connection: bool = False


SPARSIFY_LAYER = re.compile(r"layers[._](\d+)$")


def read_sparsify(directory: Path) -> tuple[SAEInfo, SAE]:
    """An EleutherAI sparsify folder (`layers.N`): a TopK SAE on block N's output."""
    config: SparsifyConfig = validated(TypeAdapter(SparsifyConfig), directory / SPARSIFY_CONFIG)
    if config.transcode or config.skip_connection:
        raise SAEFormatError(f"{directory.name}: " + NOT_STEERED.format(what="a transcoder"))
    if config.activation != "topk":
        raise SAEFormatError(
            f"{SPARSIFY_CONFIG}: activation {config.activation!r}: millm reads topk sparsify SAEs"
        )
    match = SPARSIFY_LAYER.search(directory.name)
    if match is None:
        raise SAEFormatError(
            f"{directory.name}: a sparsify SAE's folder names its layer (layers.N); "
            + NOT_STEERED.format(what="another site")
        )
    d_sae = config.num_latents or config.d_in * config.expansion_factor
    raw = _load_safetensors(directory / SPARSIFY_WEIGHTS)
    if "encoder.weight" not in raw or "W_dec" not in raw:
        raise SAEFormatError(
            f"{SPARSIFY_WEIGHTS} lacks encoder.weight or W_dec (found: {sorted(raw)})"
        )
    tensors = {
        "W_enc": raw["encoder.weight"].T,
        "b_enc": raw.get("encoder.bias", torch.zeros(d_sae)),
        "W_dec": raw["W_dec"],
        "b_dec": raw.get("b_dec", torch.zeros(config.d_in)),
    }
    if config.k > d_sae:
        raise SAEFormatError(f"{SPARSIFY_CONFIG}: k {config.k} is more than the {d_sae} latents")
    weights = weights_from(tensors, config.d_in, d_sae, SPARSIFY_WEIGHTS)
    sae = TopKSAE(weights, config.k, apply_b_dec_to_input=True)
    layer = int(match.group(1))
    return _info(directory, directory / SPARSIFY_WEIGHTS, "sparsify", sae, layer, k=config.k), sae
