"""How closely llama.cpp's reads and steering agree with the transformers engine on the packaged
models.

For each packaged model (the demo's SmolLM2 Q4_1 file and Gemma 3 270M's Q4_K_M file) and its
shipped SAE, both engines in this process: transformers on the file's float32 dequantised copy
(exact arithmetic on the same weights) and llama.cpp on the file itself (which rounds
activations to 8 bits before its quantised products). Over a few prompts, at the SAE's layer
before any steering:
- the unsteered gap: the largest difference between the two engines' next-token logits, beside
  the logits' own spread;
- SAE activations at every prompt position: the cosine between the engines' activation vectors
  (mean and lowest over positions) and the overlap of their top 16 features;
- one feature steered (the demo's pirate feature at 40; Gemma's reading feature at 2, its decoder
  rows having norm 250):
  each engine's change of the last position's logits, their cosine and largest difference.

    .venv/bin/python bench/llamacpp_agreement.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.engine.jobs import ResidualRead, ResidualsRead  # noqa: E402
from millm.engine.loader import load_model  # noqa: E402
from millm.engine.loader_llamacpp import load_with_llamacpp  # noqa: E402
from millm.engine.residual import ResidualEdit  # noqa: E402
from millm.engine.sources import DEMO_MODEL_NAME, GEMMA3_MODEL_NAME, PACKAGED, packaged_source  # noqa: E402
from millm.interp.formats import read_sae  # noqa: E402
from tests.integration.engine_helpers import generate, logits_of, row  # noqa: E402

SAES = ROOT / "millm" / "demo" / "sae"
# (model, its shipped SAE, a feature its docs steer, the strength they steer it at)
MODELS = [
    (DEMO_MODEL_NAME, SAES / "smollm2-135m-topk", 1403, 40.0),  # pirate
    (GEMMA3_MODEL_NAME, SAES / "gemma3-270m-topk", 1346, 2.0),  # reading (decoder norm 250)
]
PROMPTS = [
    "Tell me about your weekend.",
    "The capital of France is Paris, and the river that runs through it is the",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Once upon a time, a pirate sailed the seven seas looking for treasure.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
]
TOP = 16


def activations(lm, ids: list[int], layer: int, sae) -> torch.Tensor:
    read = ResidualRead(layer, False, "prompt", "agreement", encode=sae.encode)
    outcome = generate(lm, [replace(row(ids, 1), reads=(read,))])
    return next(e for e in outcome.events if isinstance(e, ResidualsRead)).encoded.float()


def compare(name: str, sae_dir: Path, feature: int, strength: float, home: Path) -> list[str]:
    info, sae = read_sae(sae_dir)
    layer = int(info.layer)
    source = packaged_source(PACKAGED[name], home / "hub")
    exact = load_model(source, dtype="float32", device="cpu", cache_root=home / "cache")
    cpp = load_with_llamacpp(source, dtype="auto", cache_root=home / "cache", sequences=4)
    vector = strength * sae.W_dec[feature].detach().float()
    edit = ResidualEdit(((layer, vector),))
    gaps, spreads, cosines, lowest, overlaps, delta_cos, delta_gap = [], [], [], [], [], [], []
    with torch.inference_mode():
        for text in PROMPTS:
            ids = exact.tokenizer(text)["input_ids"]
            plain = [logits_of(lm, [ids])[0].float() for lm in (exact, cpp)]
            gaps.append((plain[0] - plain[1]).abs().max().item())
            spreads.append((plain[0].max() - plain[0].min()).item())
            ours, theirs = activations(cpp, ids, layer, sae), activations(exact, ids, layer, sae)
            cos = torch.nn.functional.cosine_similarity(ours, theirs, dim=1)
            cosines.append(cos.mean().item())
            lowest.append(cos.min().item())
            top_ours, top_theirs = ours.topk(TOP, dim=1).indices, theirs.topk(TOP, dim=1).indices
            shared = [
                len(set(a.tolist()) & set(b.tolist())) / TOP
                for a, b in zip(top_ours, top_theirs, strict=True)
            ]
            overlaps.append(sum(shared) / len(shared))
            deltas = [
                logits_of(lm, [ids], edit)[0].float() - p
                for lm, p in zip((exact, cpp), plain, strict=True)
            ]
            delta_cos.append(
                torch.nn.functional.cosine_similarity(deltas[0], deltas[1], dim=0).item()
            )
            delta_gap.append(
                f"{(deltas[0] - deltas[1]).abs().max().item():.2f} of "
                f"{deltas[0].abs().max().item():.1f}"
            )
    cpp.runner.close()
    mean = lambda values: sum(values) / len(values)
    return [
        f"| {name} ({source.gguf_file}), SAE layer {layer}, feature {feature} at {strength:g} | "
        f"{max(gaps):.2f} (logit spread {mean(spreads):.0f}) | {mean(cosines):.4f} (lowest "
        f"{min(lowest):.3f}) | {mean(overlaps):.3f} | {mean(delta_cos):.4f} (lowest "
        f"{min(delta_cos):.4f}) | {', '.join(delta_gap)} |"
    ]


def main() -> int:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    home = Path(tempfile.gettempdir()) / "millm-bench-agreement"
    print(
        f"\n{len(PROMPTS)} prompts; activations at every prompt position, before steering; top "
        f"{TOP} features"
    )
    print(
        "| model | unsteered logit gap (max) | activation cosine (mean) | top-16 overlap | "
        "steered delta cosine | delta gap (max of largest change) |"
    )
    print("|---|---|---|---|---|---|")
    for name, sae_dir, feature, strength in MODELS:
        for line in compare(name, sae_dir, feature, strength, home):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
