"""Random transcoder sets in circuit-tracer's format, shaped for the tiny models (d_model 64)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

CONFIG = """model_kind: transcoder_set
feature_input_hook: mlp.hook_in
feature_output_hook: mlp.hook_out
scan: tiny-transcoders
"""


def transcoder_tensors(
    d_model: int, width: int, seed: int, jumprelu: bool, skip: bool = False
) -> dict[str, torch.Tensor]:
    """circuit-tracer's SingleLayerTranscoder state: W_enc and W_dec both [width, d_model]
    (and W_skip [d_model, d_model] with `skip`)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        "W_enc": torch.randn(width, d_model, generator=generator) * 0.3,
        "W_dec": torch.randn(width, d_model, generator=generator) * 0.1,
        "b_enc": torch.randn(width, generator=generator) * 0.1,
        "b_dec": torch.randn(d_model, generator=generator) * 0.05,
    }
    if jumprelu:
        tensors["activation_function.threshold"] = torch.rand(width, generator=generator) * 0.2
    if skip:
        tensors["W_skip"] = torch.randn(d_model, d_model, generator=generator) * 0.05
    return tensors


def build_transcoder_set(
    directory: Path,
    blocks: int = 3,
    d_model: int = 64,
    width: int = 48,
    seed: int = 0,
    jumprelu: bool = True,
    config: str = CONFIG,
    labels: bool = False,
    skip: bool = False,
) -> Path:
    """layer_{i}.safetensors for every block and the config.yaml beside them; with `labels`,
    layer_{i}.labels.json beside each (a plain map: feature j of block i is "block i #j")."""
    directory.mkdir(parents=True, exist_ok=True)
    for layer in range(blocks):
        save_file(
            transcoder_tensors(d_model, width, seed + layer, jumprelu, skip),
            str(directory / f"layer_{layer}.safetensors"),
        )
        if labels:
            named = {str(j): f"block {layer} #{j}" for j in range(width)}
            (directory / f"layer_{layer}.labels.json").write_text(json.dumps(named))
    (directory / "config.yaml").write_text(config)
    return directory


def build_gemma_scope_npz(path: Path, d_model: int = 64, width: int = 48, seed: int = 0) -> Path:
    """One Gemma Scope transcoder file: params.npz with W_enc [d_model, width] and a threshold."""
    tensors = transcoder_tensors(d_model, width, seed, jumprelu=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        W_enc=tensors["W_enc"].T.numpy(),
        W_dec=tensors["W_dec"].numpy(),
        b_enc=tensors["b_enc"].numpy(),
        b_dec=tensors["b_dec"].numpy(),
        threshold=tensors["activation_function.threshold"].numpy(),
    )
    return path


CLT_CONFIG = """model_kind: cross_layer_transcoder
feature_input_hook: mlp.hook_in
feature_output_hook: mlp.hook_out
scan: tiny-clt
"""


def build_clt(
    directory: Path,
    blocks: int = 3,
    d_model: int = 64,
    width: int = 48,
    seed: int = 0,
    jumprelu: bool = True,
) -> Path:
    """A random cross-layer transcoder as circuit-tracer's CrossLayerTranscoder.to_safetensors
    writes it: W_enc_{i} (W_enc, b_enc, b_dec, threshold) and W_dec_{i} `[width, blocks - i,
    d_model]` files, and its config.yaml."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    for i in range(blocks):
        encoder = {
            f"W_enc_{i}": torch.randn(width, d_model, generator=generator) * 0.3,
            f"b_enc_{i}": torch.randn(width, generator=generator) * 0.1,
            f"b_dec_{i}": torch.randn(d_model, generator=generator) * 0.05,
        }
        if jumprelu:
            encoder[f"threshold_{i}"] = torch.rand(width, generator=generator) * 0.2
        save_file(encoder, str(directory / f"W_enc_{i}.safetensors"))
        decoder = torch.randn(width, blocks - i, d_model, generator=generator) * 0.1
        save_file({f"W_dec_{i}": decoder}, str(directory / f"W_dec_{i}.safetensors"))
    (directory / "config.yaml").write_text(CLT_CONFIG)
    return directory


def build_gemma_scope_2_file(path: Path, d_model: int = 64, width: int = 48, seed: int = 0) -> Path:
    """One Gemma Scope 2 transcoder: params.safetensors with w_enc [d_model, width], w_dec,
    b_enc, b_dec, threshold and an affine_skip_connection [d_model, d_model]."""
    tensors = transcoder_tensors(d_model, width, seed, jumprelu=True, skip=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            "w_enc": tensors["W_enc"].T.contiguous(),
            "w_dec": tensors["W_dec"],
            "b_enc": tensors["b_enc"],
            "b_dec": tensors["b_dec"],
            "threshold": tensors["activation_function.threshold"],
            "affine_skip_connection": tensors["W_skip"],
        },
        str(path),
    )
    return path


def build_gemma_scope_2_clt(
    directory: Path, blocks: int = 3, d_model: int = 64, width: int = 48, seed: int = 0
) -> Path:
    """A random Gemma Scope 2 cross-layer transcoder: one params.safetensors per layer (w_enc
    [d_model, width], w_dec [width, blocks, d_model], b_enc, b_dec, threshold,
    affine_skip_connection) listed by a cross_layer_transcoder config."""
    generator = torch.Generator().manual_seed(seed)
    for i in range(blocks):
        path = directory / f"layer_{i}" / "params.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {
                "w_enc": torch.randn(d_model, width, generator=generator) * 0.3,
                "w_dec": torch.randn(width, blocks, d_model, generator=generator) * 0.1,
                "b_enc": torch.randn(width, generator=generator) * 0.1,
                "b_dec": torch.randn(d_model, generator=generator) * 0.05,
                "threshold": torch.rand(width, generator=generator) * 0.2,
                "affine_skip_connection": torch.randn(d_model, d_model, generator=generator) * 0.05,
            },
            str(path),
        )
    listed = "".join(f"  - layer_{i}/params.safetensors\n" for i in range(blocks))
    (directory / "config.yaml").write_text(CLT_CONFIG + "transcoders:\n" + listed)
    return directory
