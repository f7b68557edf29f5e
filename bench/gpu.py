"""Decode speed on a GPU in one script: millm's lean runner on a random-weight Gemma-2-2B-shaped
model at 1, 8 and 32 streams, unsteered, one feature steered, 8 distinct steerings in one batch,
and an SAE read on every row, beside transformers' `generate` on the same weights, in one run and
within a time budget (default 270 s; what did not fit is said).

It measures today's eager path (the baseline a compiled step and CUDA graphs must beat); on a
machine without CUDA it runs on the CPU. `--shape tiny` builds a 2-block model of width 64 (what
the tests run); `--tokenizer` names a tokenizer folder (default: the demo model's, read from its
GGUF). The model's vocabulary is the tokenizer's (Gemma 2's own is 256,000: its output layer
would be 5x wider).

    python bench/gpu.py [--shape gemma2-2b|tiny] [--streams 1,8,32] [--tokens 64] [--budget 270]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.engine.jobs import ResidualRead  # noqa: E402
from millm.engine.loader import load_model  # noqa: E402
from millm.engine.reading import Capture, taps  # noqa: E402
from millm.engine.sources import demo_source, resolve_source  # noqa: E402
from millm.interp.sae import SAEWeights, StandardSAE  # noqa: E402
from millm.interp.sae_files import SAEInfo  # noqa: E402
from millm.interp.steering import Attached, steering_edit  # noqa: E402

SHAPES = {  # Gemma 2 2B's published configuration, and a tiny one of the same family
    "gemma2-2b": dict(
        hidden_size=2304,
        num_hidden_layers=26,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        intermediate_size=9216,
        query_pre_attn_scalar=256,
        sliding_window=4096,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        query_pre_attn_scalar=16,
        sliding_window=16,
    ),
}
SAE_WIDTH = {"gemma2-2b": 16384, "tiny": 128}
PROMPT_TOKENS = 32


def demo_tokenizer(folder: Path) -> Path:
    """The demo model's tokenizer, written to `folder` (read from its GGUF through millm's
    loader)."""
    lm = load_model(demo_source(), dtype="float32", device="cpu", cache_root=folder / "cache")
    lm.tokenizer.save_pretrained(str(folder / "tokenizer"))
    return folder / "tokenizer"


def build_model(folder: Path, shape: str, tokenizer_dir: Path, dtype: torch.dtype) -> Path:
    """A random-weight Gemma 2 checkpoint of `shape` with the tokenizer beside it."""
    from transformers import AutoTokenizer, Gemma2Config, Gemma2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = Gemma2Config(
        **SHAPES[shape],
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id or 0,
        eos_token_id=tokenizer.eos_token_id or 0,
        pad_token_id=tokenizer.pad_token_id or 0,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    )
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).to(dtype)
    target = folder / f"gemma2-{shape}"
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return target


def random_sae(width: int, features: int, layer: int, device) -> Attached:
    """A ReLU SAE of random weights on `layer`'s residual."""
    generator = torch.Generator().manual_seed(1)
    weights = SAEWeights(
        torch.randn(width, features, generator=generator) / width**0.5,
        torch.zeros(features),
        torch.randn(features, width, generator=generator) / width**0.5,
        torch.zeros(width),
    )
    info = SAEInfo(
        "sae_bench", "saelens", "", "standard", width, features, layer, "resid_post", None
    )
    return Attached(info, StandardSAE(weights).to(device), layer)


def decode_rate(lm, prompts, tokens: int, edits=None, read: Attached | None = None) -> float:
    """Generated tokens per second over `tokens` greedy steps of every row (prefill excluded)."""
    runner, editor = lm.runner, lm.residual
    rows = len(prompts)
    with torch.inference_mode():
        stacked = editor.stack(edits or [None] * rows)
        editor.install(stacked)
        try:
            batch, logits = runner.prefill(prompts, capacity=PROMPT_TOKENS + tokens + 1)
            captures = []
            if read is not None:
                wanted = ResidualRead(read.point, True, "all", "bench")
                captures = [[Capture(wanted, PROMPT_TOKENS)] for _ in range(rows)]
            synchronize(lm.device)
            start = time.perf_counter()
            for step in range(tokens):
                if captures:
                    columns = [(c, PROMPT_TOKENS + step, 1) for c in captures]
                    editor.install(stacked, taps(columns))
                logits = runner.step(batch, logits.argmax(-1))
            synchronize(lm.device)
            took = time.perf_counter() - start
            if any(len(c[0].positions) != tokens for c in captures):
                raise RuntimeError("the SAE read missed decode steps")
            return rows * tokens / took
        finally:
            editor.clear()


def generate_rate(model, prompts, tokens: int, device) -> float:
    """transformers' `generate` (greedy, the same count of new tokens) on the same weights."""
    ids = torch.tensor(prompts, device=device)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
        synchronize(device)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        synchronize(device)
    return len(prompts) * tokens / (time.perf_counter() - start)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timings on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="gemma2-2b", choices=sorted(SHAPES))
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--budget", type=float, default=270.0, help="seconds for the whole run")
    parser.add_argument("--tokenizer", type=Path, default=None)
    args = parser.parse_args()
    began = time.monotonic()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    folder = Path(tempfile.mkdtemp(prefix="millm-gpu-bench-"))
    tokenizer_dir = args.tokenizer or demo_tokenizer(folder)
    checkpoint = build_model(folder, args.shape, tokenizer_dir, dtype)
    lm = load_model(
        resolve_source(str(checkpoint), folder / "hub"),
        dtype=str(dtype).removeprefix("torch."),
        device=device.type,
        cache_root=folder / "cache",
    )
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).to(device).eval()
    layer = lm.config.num_hidden_layers // 2
    sae = random_sae(lm.config.hidden_size, SAE_WIDTH[args.shape], layer, device)
    attached = {sae.info.id: sae}
    one = steering_edit({sae.info.id: {0: 4.0}}, attached)
    distinct = [steering_edit({sae.info.id: {i: 4.0}}, attached) for i in range(8)]
    generator = torch.Generator().manual_seed(2)
    vocabulary = int(lm.config.vocab_size)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"\n{args.shape} (random weights, vocabulary {vocabulary}), {dtype}, {name}, "
        f"{lm.runner.name}"
    )
    print(
        f"{args.tokens} greedy tokens per stream, prompts of {PROMPT_TOKENS} tokens; tok/s summed "
        "over streams\n"
    )
    print(
        "| streams | unsteered | one feature steered | 8 steerings in the batch | SAE read on | "
        "transformers generate |"
    )
    print("|---|---|---|---|---|---|")
    for streams in (int(s) for s in args.streams.split(",")):
        if time.monotonic() - began > args.budget:
            print(f"| {streams} | (left out: past the {args.budget:.0f} s budget) | | | | |")
            continue
        prompts = torch.randint(
            0, vocabulary, (streams, PROMPT_TOKENS), generator=generator
        ).tolist()
        decode_rate(lm, prompts, 2)  # warm-up at this batch size
        figures = [
            decode_rate(lm, prompts, args.tokens),
            decode_rate(lm, prompts, args.tokens, [one] * streams),
            decode_rate(lm, prompts, args.tokens, [distinct[i % 8] for i in range(streams)]),
            decode_rate(lm, prompts, args.tokens, read=sae),
            generate_rate(stock, prompts, args.tokens, device),
        ]
        print(f"| {streams} | " + " | ".join(f"{f:.1f}" for f in figures) + " |")
    print(f"\n{time.monotonic() - began:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
