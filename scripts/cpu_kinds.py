"""How the demo model's numbers move between CPU kinds, imitated on this one machine.

Each ISA cap that torch, oneDNN and MKL honour runs in a new interpreter (they read the caps at
their first operation): the demo model (its default: bf16 with the int4 kernel) decodes the
README's weekend question greedily, and the same under --reproducible numerics. Printed as the
table docs/testing.md keeps: where each capped run's greedy tokens first part from the uncapped
run's, the largest logit difference at the first step, and whether the reproducible run's every
logit is equal bit for bit.

    .venv/bin/python scripts/cpu_kinds.py [--tokens 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CAPS = {
    "this CPU, uncapped": {},
    "AVX-512 without bf16 (ONEDNN_MAX_CPU_ISA=AVX512_CORE)": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "AVX2 only (an AMD without AVX-512)": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "SSE4.2 (ATen's portable loops)": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}
RUN = """
import hashlib, json, sys
from pathlib import Path
reproducible = sys.argv[2] == "reproducible"
if reproducible:
    from millm.engine.numerics import fix_cpu_numerics
    fix_cpu_numerics()
import torch
from millm.engine.loader import load_model
from millm.engine.sources import demo_source
lm = load_model(demo_source(), dtype="float32" if reproducible else "auto", device="cpu",
                cache_root=Path(sys.argv[1]), reproducible=reproducible)
question = [{"role": "user", "content": "Tell me about your weekend."}]
prompt = lm.tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=True)
prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
digest, tokens, first = hashlib.sha256(), [], None
with torch.inference_mode():
    batch, logits = lm.runner.prefill([prompt], len(prompt) + int(sys.argv[3]) + 1)
    for _ in range(int(sys.argv[3])):
        logits = logits.float()
        first = logits[0].tolist() if first is None else first
        digest.update(logits.numpy().tobytes())
        tokens.append(int(logits[0].argmax()))
        logits = lm.runner.step(batch, torch.tensor([tokens[-1]]))
capability = torch.backends.cpu.get_cpu_capability()
print(json.dumps({"kernels": lm.runner.kernels, "capability": capability,
                  "digest": digest.hexdigest(), "tokens": tokens, "first": first,
                  "text": lm.tokenizer.decode(tokens)}))
"""


def run(cache: Path, caps: dict[str, str], mode: str, tokens: int) -> dict:
    """One capped run in a new interpreter."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **caps}
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(cache), mode, str(tokens)],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def parted_at(a: list[int], b: list[int]) -> str:
    """The first step at which two greedy runs chose different tokens, or 'never'."""
    return next((str(i) for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), "never")


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        rows = {
            name: (
                run(Path(cache), caps, "fast", args.tokens),
                run(Path(cache), caps, "reproducible", args.tokens),
            )
            for name, caps in CAPS.items()
        }
    base_fast, base_exact = rows["this CPU, uncapped"]
    print(
        "| cap | ATen | linear kernels | greedy tokens part from uncapped at step (of "
        f"{args.tokens}) | largest first-step logit difference | --reproducible: every logit "
        "equal |"
    )
    print("|---|---|---|---|---|---|")
    for name, (fast, exact) in rows.items():
        gap = max(abs(x - y) for x, y in zip(fast["first"], base_fast["first"], strict=True))
        print(
            f"| {name} | {fast['capability']} | {fast['kernels']} | "
            f"{parted_at(fast['tokens'], base_fast['tokens'])} | {gap:.2e} | "
            f"{'yes' if exact['digest'] == base_exact['digest'] else 'NO'} |"
        )
    print(f"\nuncapped: {base_fast['text']!r}\nreproducible: {base_exact['text']!r}")


if __name__ == "__main__":
    main()
