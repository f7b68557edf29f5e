"""The reference for a steered pass: transformers' forward with strength x an SAE's decoder row
added to block `layer`'s output at every position (a forward hook), which is what steering one
feature does."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def hooked_model(model_dir: Path, sae_dir: Path, layer: int, index: int, strength: float):
    """The checkpoint (float32) with the feature's addition hooked after block `layer`."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    added = strength * load_file(str(sae_dir / "sae_weights.safetensors"))["W_dec"][index]

    def add(_module, _inputs, output):
        if isinstance(output, tuple):
            return (output[0] + added, *output[1:])
        return output + added

    model.model.layers[layer].register_forward_hook(add)
    return model


def steered_logprobs(
    model_dir: Path, sae_dir: Path, ids: list[int], layer: int, index: int, strength: float
) -> torch.Tensor:
    """log-probabilities `[len(ids), V]` at every position of the hooked forward pass."""
    model = hooked_model(model_dir, sae_dir, layer, index, strength)
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
