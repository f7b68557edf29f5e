"""Steered vs unsteered single-stream decode on the demo model, in one run (goal: ratio >= 0.98).

Steering adds one `[B, 1, d]` vector per steered layer through a forward hook. Runs alternate
(unsteered, steered, unsteered, ...) so drift on a shared machine hits both alike; the table
gives the best and median of each. `--source transcoder` steers the demo transcoder set's block
12 attached as an SAE instead of the demo SAE; `--op clamp` clamps the 8 features at 4.0
instead of adding (a transcoder's clamp reads its block's MLP input in the same pass).

    .venv/bin/python bench/steering_speed.py [--tokens 128] [--repeats 5] [--dtype auto]
        [--layers 1] [--source sae|transcoder] [--op add|clamp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_speed import PROMPT  # noqa: E402

from millm.engine.generate import run_job  # noqa: E402
from millm.engine.jobs import GenerationJob, RowFinished, RowSpec, TextDelta  # noqa: E402
from millm.engine.loader import load_model  # noqa: E402
from millm.engine.sampling import SamplingParams  # noqa: E402
from millm.engine.sources import demo_source  # noqa: E402
from millm.interp.formats import read_sae  # noqa: E402
from millm.interp.steering import Attached, FeatureOp, feature_edit  # noqa: E402
from millm.kernel.model.shipped import DEMO_SAE, SHIPPED_TRANSCODERS  # noqa: E402

TRANSCODER_BLOCK = 12


def decode_rate(lm, prompt_ids, tokens, edit) -> float:
    """Decode tok/s of one greedy row (first token excluded)."""
    import time

    marks = []
    count = []

    def emit(event):
        if isinstance(event, TextDelta) and not marks:
            marks.append(time.perf_counter())
        elif isinstance(event, RowFinished):
            marks.append(time.perf_counter())
            count.append(event.completion_tokens)

    spec = RowSpec(
        prompt_ids=tuple(prompt_ids),
        sampling=SamplingParams(temperature=0.0),
        max_tokens=tokens,
        edit=edit,
    )
    run_job(lm, GenerationJob(rows=[spec], emit=emit))
    return (count[0] - 1) / (marks[-1] - marks[0])


def demo_model_and_sae(dtype: str, source: str = "sae"):
    """The demo model in process (EOS ignored: rows decode a fixed count) and the demo SAE (or
    the demo transcoder set's block 12) on its device."""
    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    lm = load_model(demo_source(), dtype=dtype, device="cpu", cache_root=home / "cache")
    lm = replace(lm, eos_token_ids=frozenset())
    if source == "transcoder":
        directory = SHIPPED_TRANSCODERS[lm.source.name][0]
        info, sae = read_sae(directory / f"layer_{TRANSCODER_BLOCK}.safetensors")
    else:
        info, sae = read_sae(DEMO_SAE)
    sae.to(lm.device)
    return lm, info, sae


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument(
        "--layers",
        type=int,
        default=1,
        help="steer at this many layers (the SAE's, then neighbours)",
    )
    parser.add_argument("--source", default="sae", choices=["sae", "transcoder"])
    parser.add_argument("--op", default="add", choices=["add", "clamp"])
    args = parser.parse_args()

    lm, info, sae = demo_model_and_sae(args.dtype, args.source)
    attached = {}
    for offset in range(args.layers):
        layer = (info.layer + offset) % lm.model.config.num_hidden_layers
        attached[f"{info.id}@{layer}"] = Attached(info, sae, layer)
    op = FeatureOp("add", 4.0) if args.op == "add" else FeatureOp("clamp", value=4.0)
    edit = feature_edit({key: {i: op for i in range(8)} for key in attached}, attached)
    prompt_ids = lm.tokenizer(PROMPT)["input_ids"]

    decode_rate(lm, prompt_ids, 16, None)
    decode_rate(lm, prompt_ids, 16, edit)
    plain, steered = [], []
    for _ in range(args.repeats):
        plain.append(decode_rate(lm, prompt_ids, args.tokens, None))
        steered.append(decode_rate(lm, prompt_ids, args.tokens, edit))

    print(
        f"\nSmolLM2-135M-Instruct, {lm.dtype_name} ({lm.runner.kernels}), {args.tokens} greedy "
        f"tokens, torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} "
        "alternating runs"
    )
    print("| path | best tok/s | median tok/s |")
    print("|---|---|---|")
    print(f"| unsteered | {max(plain):.1f} | {statistics.median(plain):.1f} |")
    what = f"{args.op} 8 features of the {'demo SAE' if args.source == 'sae' else 'transcoder'}"
    print(
        f"| {what} at {args.layers} layer{'s' if args.layers > 1 else ''} | {max(steered):.1f} | "
        f"{statistics.median(steered):.1f} |"
    )
    ratio = statistics.median(steered) / statistics.median(plain)
    print(f"\nsteered / unsteered (medians) = {ratio:.3f}  (goal >= 0.98)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
