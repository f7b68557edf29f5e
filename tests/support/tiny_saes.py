"""Random-weight SAE files of every supported format, shaped for the tiny models (d_in 64)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file


def sae_tensors(
    d_in: int, d_sae: int, seed: int = 0, unit_decoder: bool = True
) -> dict[str, torch.Tensor]:
    """W_enc [d_in, d_sae], b_enc, W_dec [d_sae, d_in] (unit rows), b_dec."""
    generator = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(d_sae, d_in, generator=generator)
    if unit_decoder:
        w_dec = w_dec / w_dec.norm(dim=-1, keepdim=True)
    return {
        "W_enc": torch.randn(d_in, d_sae, generator=generator) * 0.3,
        "b_enc": torch.randn(d_sae, generator=generator) * 0.1,
        "W_dec": w_dec,
        "b_dec": torch.randn(d_in, generator=generator) * 0.1,
    }


def build_saelens(
    directory: Path,
    *,
    d_in: int = 64,
    d_sae: int = 128,
    layer: int = 1,
    architecture: str = "topk",
    hook_point: str = "resid_post",
    seed: int = 0,
    labels: bool = True,
    config: dict | None = None,
    tensors: dict | None = None,
) -> Path:
    """A SAELens directory (cfg.json, sae_weights.safetensors, feature_labels.json)."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = tensors if tensors is not None else sae_tensors(d_in, d_sae, seed)
    cfg = {
        "architecture": architecture,
        "d_in": d_in,
        "d_sae": d_sae,
        "hook_name": f"blocks.{layer}.hook_{hook_point}",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "model_name": "tiny-llama",
        "dtype": "float32",
    }
    if tensors is None and architecture == "topk":
        cfg["k"] = 8
    if tensors is None and architecture == "jumprelu":
        weights["threshold"] = (
            torch.rand(d_sae, generator=torch.Generator().manual_seed(seed + 1)) * 0.2
        )
    cfg.update(config or {})
    (directory / "cfg.json").write_text(json.dumps(cfg))
    save_file(
        {k: v.contiguous() for k, v in weights.items()}, str(directory / "sae_weights.safetensors")
    )
    if labels:
        entries = {
            str(i): {
                "label": f"feature {i} " + ("paris" if i % 10 == 0 else "river"),
                "top_tokens": [f"tok{i}"],
            }
            for i in range(d_sae)
        }
        (directory / "feature_labels.json").write_text(json.dumps(entries))
    return directory


def build_gemma_scope(
    path: Path, *, d_in: int = 64, d_sae: int = 128, seed: int = 0, lower_case: bool = False
) -> Path:
    """A Gemma Scope params.npz (JumpReLU with threshold) at path (put layer_N in the path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = sae_tensors(d_in, d_sae, seed)
    arrays = {
        ("w_enc" if lower_case else "W_enc"): weights["W_enc"],
        ("w_dec" if lower_case else "W_dec"): weights["W_dec"],
    }
    arrays.update(
        b_enc=weights["b_enc"],
        b_dec=weights["b_dec"],
        threshold=torch.rand(d_sae, generator=torch.Generator().manual_seed(seed + 1)) * 0.2,
    )
    np.savez(path, **{k: v.numpy() for k, v in arrays.items()})
    return path


def build_gemma_scope_2(
    directory: Path, *, d_in: int = 64, d_sae: int = 128, seed: int = 0, hook: str | None = None
) -> Path:
    """A Gemma Scope 2 folder: params.safetensors (lower-case names) and, with `hook`, a
    config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = sae_tensors(d_in, d_sae, seed)
    tensors = {
        "w_enc": weights["W_enc"],
        "w_dec": weights["W_dec"],
        "b_enc": weights["b_enc"],
        "b_dec": weights["b_dec"],
        "threshold": torch.rand(d_sae, generator=torch.Generator().manual_seed(seed + 1)) * 0.2,
    }
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(directory / "params.safetensors")
    )
    if hook is not None:
        config = {
            "architecture": "jump_relu",
            "hf_hook_point_in": hook,
            "model_name": "gemma-v3-270m-pt",
        }
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def build_llama_scope(
    directory: Path,
    *,
    d_in: int = 64,
    d_sae: int = 128,
    layer: int = 1,
    seed: int = 0,
    average_norm: float = 2.0,
    threshold: float = 0.05,
    site: str = "resid_post",
) -> Path:
    """A Llama Scope folder: hyperparams.json and checkpoints/final.safetensors (nn.Linear layout).
    The weights are bfloat16 values (as Llama Scope ships them), so a bf16 reader loses nothing."""
    (directory / "checkpoints").mkdir(parents=True, exist_ok=True)
    weights = {k: v.bfloat16().float() for k, v in sae_tensors(d_in, d_sae, seed).items()}
    tensors = {
        "encoder.weight": weights["W_enc"].T,
        "encoder.bias": weights["b_enc"],
        "decoder.weight": weights["W_dec"].T,
        "decoder.bias": weights["b_dec"],
    }
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(directory / "checkpoints" / "final.safetensors"),
    )
    hyper = {
        "d_model": d_in,
        "d_sae": d_sae,
        "hook_point_in": f"blocks.{layer}.hook_{site}",
        "hook_point_out": f"blocks.{layer}.hook_{site}",
        "jump_relu_threshold": threshold,
        "dataset_average_activation_norm": {"in": average_norm, "out": average_norm},
        "norm_activation": "dataset-wise",
    }
    (directory / "hyperparams.json").write_text(json.dumps(hyper))
    return directory


def build_sparsify(
    directory: Path, *, d_in: int = 64, d_sae: int = 128, k: int = 8, seed: int = 0, **config
) -> Path:
    """An EleutherAI sparsify folder (name it layers.N): cfg.json and sae.safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = sae_tensors(d_in, d_sae, seed)
    tensors = {
        "encoder.weight": weights["W_enc"].T,
        "encoder.bias": weights["b_enc"],
        "W_dec": weights["W_dec"],
        "b_dec": weights["b_dec"],
    }
    save_file({k_: v.contiguous() for k_, v in tensors.items()}, str(directory / "sae.safetensors"))
    cfg = {
        "activation": "topk",
        "expansion_factor": 2,
        "normalize_decoder": True,
        "num_latents": d_sae,
        "k": k,
        "multi_topk": False,
        "skip_connection": False,
        "transcode": False,
        "d_in": d_in,
        **config,
    }
    (directory / "cfg.json").write_text(json.dumps(cfg))
    return directory
