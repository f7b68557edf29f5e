"""Single-stream decode speed on the demo model, every path in one run, one table.

(a) millm's engine in-process, (b) transformers' model.generate on the same weights and dtype,
(c) millm through HTTP streaming with the openai SDK, (d) llama.cpp (llama-cpp-python, when
installed) on an F16 GGUF of the same dequantised weights. Each path decodes the same greedy
prompt for --tokens new tokens; decode tok/s excludes the first token (time to first token is
reported apart). Each figure is the best of --repeats runs (the machine may be shared).

    .venv/bin/python bench/decode_speed.py [--tokens 128] [--repeats 3] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.engine.generate import run_job  # noqa: E402
from millm.engine.jobs import GenerationJob, RowFinished, RowSpec, TextDelta  # noqa: E402
from millm.engine.loader import load_model  # noqa: E402
from millm.engine.sampling import SamplingParams  # noqa: E402
from millm.engine.sources import demo_source  # noqa: E402

# A prompt the model keeps answering well past 128 tokens, so every path decodes the full count.
PROMPT = "Here is a list of the numbers from 1 to 300, separated by commas: 1, 2, 3,"


@dataclass
class Figure:
    path: str
    ttft_ms: list[float]
    tok_s: list[float]
    tokens: int

    def row(self, reference: float | None) -> str:
        best, median = max(self.tok_s), statistics.median(self.tok_s)
        ratio = f"{best / reference:5.2f}x" if reference else "    -"
        return (
            f"| {self.path:<52} | {min(self.ttft_ms):8.1f} | {best:7.1f} | {median:7.1f} | "
            f"{ratio} | {self.tokens:6d} |"
        )


def engine_run(lm, prompt_ids: list[int], tokens: int) -> tuple[float, float, int]:
    """One job through run_job: (time to first token s, decode tok/s, tokens)."""
    marks: list[float] = []
    finished: list[int] = []

    def emit(event):
        if isinstance(event, TextDelta) and not marks:
            marks.append(time.perf_counter())
        elif isinstance(event, RowFinished):
            marks.append(time.perf_counter())
            finished.append(event.completion_tokens)

    spec = RowSpec(
        prompt_ids=tuple(prompt_ids), sampling=SamplingParams(temperature=0.0), max_tokens=tokens
    )
    start = time.perf_counter()
    run_job(lm, GenerationJob(rows=[spec], emit=emit))
    first, end = marks[0], marks[-1]
    return first - start, (finished[0] - 1) / (end - first), finished[0]


def stock_model(checkpoint: Path, dtype: torch.dtype):
    """The same weights as plain transformers loads them: no millm runner, no kernels."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).eval()


def generate_run(model, prompt_ids: list[int], tokens: int) -> tuple[float, float, int]:
    """transformers' generate, greedy; first-token time from a 1-token generate."""
    ids = torch.tensor([prompt_ids])
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
        total = time.perf_counter() - start
    produced = out.shape[1] - ids.shape[1]
    return ttft, (produced - 1) / (total - ttft), produced


def http_run(base_url: str, model: str, tokens: int) -> tuple[float, float, int]:
    """millm through HTTP streaming with the openai SDK (text completion, same prompt)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    start = time.perf_counter()
    first = None
    usage = None
    for chunk in client.completions.create(
        model=model, prompt=PROMPT, max_tokens=tokens, temperature=0, stream=True
    ):
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter()
        if chunk.usage:
            usage = chunk.usage.completion_tokens
    end = time.perf_counter()
    return first - start, (usage - 1) / (end - first), usage


def llama_cpp_run(llm, tokens: int) -> tuple[float, float, int]:
    """llama.cpp streaming completion of the same prompt."""
    start = time.perf_counter()
    first = None
    count = 0
    for piece in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0, stream=True):
        if piece["choices"][0]["finish_reason"] is not None:
            continue  # the closing chunk carries no token
        count += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return first - start, (count - 1) / (end - first), count


def measure(name: str, run, repeats: int) -> Figure:
    run()  # warm-up
    results = [run() for _ in range(repeats)]
    return Figure(name, [r[0] * 1000 for r in results], [r[1] for r in results], results[-1][2])


def start_server(dtype: str, home: Path):
    from tests.support.server import ServerProcess

    return ServerProcess(home, ["--dtype", dtype, "--log-level", "warning"]).wait_ready(timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument(
        "--home", type=Path, default=None, help="data directory (default: a temporary one)"
    )
    args = parser.parse_args()

    home = args.home or Path(tempfile.mkdtemp(prefix="millm-bench-"))
    source = demo_source()
    lm = load_model(source, dtype=args.dtype, device="cpu", cache_root=home / "cache")
    # The bench decodes a fixed count: EOS must not end a path early.
    lm_no_eos = replace(lm, eos_token_ids=frozenset())
    prompt_ids = lm.tokenizer(PROMPT, add_special_tokens=True)["input_ids"]

    dtype = lm.dtype_name
    checkpoint = next((home / "cache" / "gguf").glob("*/model.safetensors")).parent
    figures = [
        measure(
            f"(a) millm engine, in-process, {dtype} ({lm.runner.kernels.split(' ')[0]})",
            lambda: engine_run(lm_no_eos, prompt_ids, args.tokens),
            args.repeats,
        )
    ]
    lm = lm_no_eos = None  # free the engine's copy before loading the stock one
    stock = stock_model(checkpoint, getattr(torch, dtype))
    figures.append(
        measure(
            f"(b) transformers generate, {dtype}",
            lambda: generate_run(stock, prompt_ids, args.tokens),
            args.repeats,
        )
    )
    if dtype != "float32":
        stock = stock_model(checkpoint, torch.float32)
        figures.append(
            measure(
                "(b') transformers generate, float32",
                lambda: generate_run(stock, prompt_ids, args.tokens),
                args.repeats,
            )
        )
    stock = None

    server = start_server(args.dtype, home)
    try:
        figures.append(
            measure(
                f"(c) millm over HTTP (openai SDK stream), {dtype}",
                lambda: http_run(server.base_url, "SmolLM2-135M-Instruct", args.tokens),
                args.repeats,
            )
        )
    finally:
        server.stop()

    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama-cpp-python is not installed: skipping (d)", file=sys.stderr)
    else:
        sys.path.insert(0, str(ROOT / "bench"))
        from make_f16_gguf import convert

        f16 = home / "smollm2-f16.gguf"
        if not f16.exists():
            convert(source.directory / source.gguf_file, f16)
        llm = Llama(str(f16), n_ctx=1024, n_threads=os.cpu_count(), verbose=False)
        figures.append(
            measure(
                "(d) llama.cpp, F16 GGUF of the same weights",
                lambda: llama_cpp_run(llm, args.tokens),
                args.repeats,
            )
        )

    reference = max(figures[1].tok_s)
    print(
        f"\nSmolLM2-135M-Instruct (dequantised Q4_1), {args.tokens} new tokens, greedy, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeats}"
    )
    print(f"| {'path':<52} | TTFT ms  | tok/s   | median  | vs (b) | tokens |")
    print(f"|{'-' * 54}|----------|---------|---------|--------|--------|")
    for figure in figures:
        print(figure.row(reference))
    engine = max(figures[0].tok_s)
    http = max(next(f for f in figures if f.path.startswith("(c)")).tok_s)
    print(
        f"\n(a)/(b) = {engine / reference:.2f}  (goal >= 2.0);  (c)/(a) = {http / engine:.2f}  "
        "(goal >= 0.95)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
