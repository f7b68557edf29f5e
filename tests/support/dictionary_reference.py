"""The float64 reference a dictionary's grade is checked against: SAEBench's core figures of a
standard SAE on the tiny Llama's block output, or of a transcoder in place of a block's MLP,
computed here with transformers and a forward hook, independently of millm's engine."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def figures(model, texts: list[list[int]], mode: dict, seen: dict) -> dict:
    """The three passes of each text under the hooked `model` (mode["now"] says which), and the
    figures from them and from what the hook kept in `seen` (x, r, l: the target, its
    reconstruction and the latents at the counted positions)."""
    return {**passes(model, texts, mode), **reconstruction(seen)}


def passes(model, texts: list[list[int]], mode: dict) -> dict:
    """The next-token figures of the clean, spliced and zeroed passes of each text."""
    ce = dict.fromkeys(("clean", "spliced", "zeroed"), 0.0)
    kl = dict.fromkeys(("spliced", "zeroed"), 0.0)
    predicted, tokens = 0, 0
    with torch.inference_mode():
        for ids in texts:
            logs = {}
            for now in ce:
                mode["now"] = now
                logits = model(torch.tensor([ids])).logits[0, 1:-1]
                logs[now] = torch.log_softmax(logits, -1)
            targets = torch.tensor(ids[2:])
            for now, log_p in logs.items():
                ce[now] -= float(log_p.gather(-1, targets[:, None]).sum())
            for now in kl:
                kl[now] += float((logs["clean"].exp() * (logs["clean"] - logs[now])).sum())
            predicted += len(targets)
            tokens += len(ids)
    ce = {now: value / predicted for now, value in ce.items()}
    kl = {now: value / predicted for now, value in kl.items()}
    return {
        "tokens": tokens,
        "ce_loss_clean": ce["clean"],
        "ce_loss_spliced": ce["spliced"],
        "ce_loss_zero_ablated": ce["zeroed"],
        "ce_loss_recovered": (ce["zeroed"] - ce["spliced"]) / (ce["zeroed"] - ce["clean"]),
        "kl_spliced": kl["spliced"],
        "kl_zero_ablated": kl["zeroed"],
        "kl_score": 1 - kl["spliced"] / kl["zeroed"],
    }


def reconstruction(seen: dict) -> dict:
    """The reconstruction figures of what a hook kept: targets x, reconstructions r, latents l."""
    x, r, latents = (torch.cat(seen[key]) for key in ("x", "r", "l"))
    variance = (x - x.mean(0)).pow(2).sum(-1).mean()
    mse = (x - r).pow(2).sum(-1).mean()
    fired = (latents > 0).double().mean(0)
    return {
        "positions": len(x),
        "fraction_variance_explained": float(1 - mse / variance),
        "mse": float(mse),
        "l0": float((latents > 0).double().sum(-1).mean()),
        "dead_fraction": float((fired == 0).double().mean()),
        "dense_fraction": float((fired > 0.1).double().mean()),
    }


def transcode(w: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A JumpReLU transcoder file's (circuit-tracer's layout) latents and prediction at x."""
    pre = x @ w["W_enc"].T + w["b_enc"]
    latents = pre * (pre > w["activation_function.threshold"])
    out = latents @ w["W_dec"] + w["b_dec"]
    return latents, out + x @ w["W_skip"].T if "W_skip" in w else out


def set_reference(model_dir: Path, directory: Path, texts: list[list[int]]) -> dict:
    """A transcoder set's grade in float64: the replacement model (every MLP output at positions
    1.. replaced by its transcoder's, fed what the replaced blocks before it wrote) against the
    clean model and every MLP zeroed; each block's reconstruction on the clean model's inputs."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    layers = model.model.layers
    weights = [
        {k: v.double() for k, v in load_file(str(directory / f"layer_{b}.safetensors")).items()}
        for b in range(len(layers))
    ]
    mode: dict = {"now": "clean"}
    seen: list[dict] = [{} for _ in layers]

    def hook(block: int):
        def replace(_module, inputs, output):
            if mode["now"] == "zeroed":
                return torch.zeros_like(output)
            latents, out = transcode(weights[block], inputs[0][0, 1:])
            if mode["now"] == "clean":
                kept = seen[block]
                kept.setdefault("x", []).append(output[0, 1:-1])
                kept.setdefault("r", []).append(out[:-1])
                kept.setdefault("l", []).append(latents[:-1])
                return output
            spliced = output.clone()
            spliced[0, 1:] = out
            return spliced

        return replace

    for block, layer in enumerate(layers):
        layer.mlp.register_forward_hook(hook(block))
    result = passes(model, texts, mode)
    result["blocks"] = [{"block": b, **reconstruction(kept)} for b, kept in enumerate(seen)]
    return result


def transcoder_reference(model_dir: Path, path: Path, block: int, texts: list[list[int]]) -> dict:
    """SAEBench's core figures of a JumpReLU transcoder file (circuit-tracer's layout, with its
    skip connection if it has one) in place of block `block`'s MLP, in float64: the clean pass,
    the MLP's output at positions 1.. replaced by the transcoder's, and the MLP zeroed."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    w = {k: v.double() for k, v in load_file(str(path)).items()}
    mode, seen = {"now": "clean"}, {}

    def hook(_module, inputs, output):
        if mode["now"] == "clean":
            return output
        if mode["now"] == "zeroed":
            return torch.zeros_like(output)
        latents, predicted = transcode(w, inputs[0][0, 1:])
        seen.setdefault("x", []).append(output[0, 1:-1])
        seen.setdefault("r", []).append(predicted[:-1])
        seen.setdefault("l", []).append(latents[:-1])
        out = output.clone()
        out[0, 1:] = predicted
        return out

    model.model.layers[block].mlp.register_forward_hook(hook)
    return figures(model, texts, mode, seen)


def reference(model_dir: Path, sae_dir: Path, texts: list[list[int]]) -> dict:
    """SAEBench's core figures of a standard SAE on block 1's output, in float64: the clean, the
    spliced (positions 1.. replaced by the reconstruction) and the zeroed pass of each text; the
    figures count positions 1 .. T-2, those whose next token is scored."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    w = {k: v.double() for k, v in load_file(str(sae_dir / "sae_weights.safetensors")).items()}
    mode, seen = {"now": "clean"}, {}

    def hook(_module, _inputs, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if mode["now"] == "clean":
            return output
        if mode["now"] == "zeroed":
            out = torch.zeros_like(hidden)
        else:
            x = hidden[0, 1:]
            latents = torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
            rebuilt = latents @ w["W_dec"] + w["b_dec"]
            # counted: the positions whose next token is scored (1 .. T-2)
            seen.setdefault("x", []).append(x[:-1])
            seen.setdefault("r", []).append(rebuilt[:-1])
            seen.setdefault("l", []).append(latents[:-1])
            out = hidden.clone()
            out[0, 1:] = rebuilt
        return (out, *output[1:]) if isinstance(output, tuple) else out

    model.model.layers[1].register_forward_hook(hook)
    return figures(model, texts, mode, seen)
