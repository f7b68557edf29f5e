"""Decode speed per model family: millm's lean runner against transformers' `generate`, and
eight streams batched against eight served one after another. One run, one table.

For every family the lean runner serves, on a tiny random checkpoint (tests/support/tiny_models,
the test suite's own builders: 3-4 layers, hidden size 64), and on the two packaged real models
(the demo SmolLM2-135M-Instruct Q4_1 under its default dtype, and gemma3-270m Q4_K_M in float32):

  (a) millm, one stream: decode tok/s (first token excluded) of one greedy row through the
      scheduler;
  (b) transformers `generate` on the same weights and dtype (greedy, same token count);
  (c) millm, eight streams submitted at once with continuous batching: aggregate tok/s;
  (d) millm, the same eight streams with batching off (served one after another): aggregate tok/s.

Goals (issue 19): a ≥ 2 × b, c ≥ 4 × a. Every measurement runs in its own process (PyTorch's
OpenMP pools of two threads in one process slow each other, see docs/engine.md), with the model
loaded on a thread that ends before decoding starts, as the server does.

    .venv/bin/python bench/families_speed.py [--tokens 64] [--families llama,gemma2,...]
        [--real demo,gemma3-270m]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAMILY_NAMES = (
    "llama",
    "llama3",
    "mistral",
    "gemma2",
    "gemma3",
    "qwen2",
    "qwen3",
    "gpt2",
    "gpt_neox",
)  # tests/support/tiny_models.FAMILIES
PROMPT = "Here is a list of the numbers from 1 to 300, separated by commas: 1, 2, 3,"
STREAMS = 8


def _source(model: str, work: Path):
    from millm.engine.sources import resolve_source
    from tests.support import tiny_models

    if model in tiny_models.FAMILIES:
        directory = work / f"tiny-{model}"
        if not directory.exists():
            if not (work / "tokenizer").exists():
                tiny_models.build_tokenizer(work / "tokenizer")
            tiny_models.FAMILIES[model](directory, work / "tokenizer")
        return resolve_source(str(directory), work / "hub")
    return resolve_source(
        {"demo": "SmolLM2-135M-Instruct", "gemma3-270m": "gemma3-270m"}[model], work / "hub"
    )


def _dtype(model: str) -> str:
    return "auto" if model == "demo" else "float32"


def _load(model: str, work: Path):
    """The model loaded on a thread that ends (as the server loads), so decoding threads meet no
    idle OpenMP pool."""
    from millm.engine.loader import load_model

    out = {}

    def run():
        out["lm"] = load_model(
            _source(model, work), dtype=_dtype(model), device="cpu", cache_root=work / "cache"
        )

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out["lm"]


def measure_millm(model: str, work: Path, tokens: int, path: str, repeats: int) -> dict:
    from millm.engine.jobs import GenerationJob, RowFinished, RowSpec, TextDelta
    from millm.engine.prompts import completion_prompt_ids
    from millm.engine.sampling import SamplingParams
    from millm.engine.scheduler import Scheduler

    lm = _load(model, work)
    # every row decodes all its tokens, as generate's min_new_tokens makes it
    lm.eos_token_ids = frozenset()
    prompt = tuple(completion_prompt_ids(lm.tokenizer, PROMPT))
    streams = 1 if path == "a" else STREAMS
    scheduler = Scheduler(lm, 64, batching=path != "d", max_batch=STREAMS)
    try:

        def run_once() -> tuple[float, int, float]:
            done = threading.Semaphore(0)
            firsts: list[float] = []
            counts: list[int] = []

            def emit(event):
                if isinstance(event, TextDelta) and not firsts:
                    firsts.append(time.perf_counter())
                elif isinstance(event, RowFinished):
                    counts.append(event.completion_tokens)
                    done.release()

            row = RowSpec(
                prompt_ids=prompt, sampling=SamplingParams(temperature=0.0), max_tokens=tokens
            )
            start = time.perf_counter()
            for _ in range(streams):
                scheduler.submit(GenerationJob(rows=[row], emit=emit))
            for _ in range(streams):
                done.acquire()
            return start, sum(counts), time.perf_counter() - (firsts[0] if streams == 1 else start)

        run_once()  # warm-up
        best = 0.0
        for _ in range(repeats):
            _, total, seconds = run_once()
            best = max(best, (total - 1) / seconds if streams == 1 else total / seconds)
    finally:
        scheduler.shutdown(timeout=60)
    return {"tok_s": best, "runner": lm.runner.name}


def measure_generate(model: str, work: Path, tokens: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from millm.engine.loader import gguf_checkpoint, pick_dtype

    source = _source(model, work)
    directory = gguf_checkpoint(source, work / "cache")[0] if source.gguf_file else source.directory
    dtype = pick_dtype(_dtype(model), torch.device("cpu"), q4_weights=model == "demo")
    model_ = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).eval()
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(directory))(PROMPT, return_tensors="pt")["input_ids"]
    best = 0.0
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            model_.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
            first = time.perf_counter() - start
            start = time.perf_counter()
            model_.generate(
                ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0
            )
            best = max(best, (tokens - 1) / (time.perf_counter() - start - first))
    return {"tok_s": best, "dtype": str(dtype).removeprefix("torch.")}


def one(args) -> None:
    work = Path(args.work)
    if args.path == "b":
        result = measure_generate(args.model, work, args.tokens, args.repeats)
    else:
        result = measure_millm(args.model, work, args.tokens, args.path, args.repeats)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs per figure after a warm-up (the best is kept)",
    )
    parser.add_argument("--families", default=",".join(FAMILY_NAMES))
    parser.add_argument("--real", default="demo,gemma3-270m")
    parser.add_argument(
        "--work",
        default=None,
        help="where tiny checkpoints and caches go (default: a temporary folder)",
    )
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        args.model, args.path = args.one
        return one(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="millm-families-"))
    models = [m for m in args.families.split(",") if m] + [m for m in args.real.split(",") if m]
    print(
        f"{args.tokens} greedy tokens per stream, {STREAMS} streams for (c) and (d); best of "
        f"{args.repeats} after a warm-up\n"
    )
    print(
        "| model | runner | (a) millm 1 stream | (b) `generate` | a/b | (c) 8 streams batched | "
        "(d) 8 streams serial | c/a | c/d |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in models:
        got = {}
        for path in "abcd":
            command = [
                sys.executable,
                __file__,
                "--one",
                model,
                path,
                "--tokens",
                str(args.tokens),
                "--repeats",
                str(args.repeats),
                "--work",
                str(work),
            ]
            out = (
                subprocess.run(command, capture_output=True, text=True, check=True)
                .stdout.strip()
                .splitlines()[-1]
            )
            got[path] = json.loads(out)
        a, b, c, d = (got[p]["tok_s"] for p in "abcd")
        name = f"{model} ({got['b']['dtype']})"
        print(
            f"| {name} | {got['a']['runner']} | {a:.1f} | {b:.1f} | {a / b:.2f}× | {c:.1f} | "
            f"{d:.1f} | {c / a:.2f}× | {c / d:.2f}× |",
            flush=True,
        )


if __name__ == "__main__":
    main()
