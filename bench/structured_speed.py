"""Constrained vs unconstrained decode on the demo model, and grammar compile time, in one run.

The constrained rows follow a judge-style JSON Schema (llguidance, whitespace bounded); the
unconstrained rows decode the same prompt freely. EOS is ignored on the unconstrained row so
both decode a comparable number of tokens; tok/s counts decoded tokens after the first.

    .venv/bin/python bench/structured_speed.py [--repeats 5] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.engine.constraints import GrammarSpec  # noqa: E402
from millm.engine.generate import run_job  # noqa: E402
from millm.engine.jobs import GenerationJob, RowFinished, RowSpec, TextDelta  # noqa: E402
from millm.engine.loader import load_model  # noqa: E402
from millm.engine.prompts import chat_prompt_ids  # noqa: E402
from millm.engine.sampling import SamplingParams  # noqa: E402
from millm.engine.sources import demo_source  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "genres": {
            "type": "array",
            "items": {"enum": ["drama", "comedy", "action", "documentary"]},
            "maxItems": 3,
        },
        "summary": {"type": "string", "maxLength": 300},
        "rating": {"type": "number", "minimum": 0, "maximum": 10},
    },
    "required": ["title", "year", "genres", "summary", "rating"],
    "additionalProperties": False,
}
MESSAGES = [
    {
        "role": "user",
        "content": "Describe the film Casablanca as JSON with title, year, genres, summary and "
        "rating.",
    }
]


def run(lm, prompt, tokens, constraint) -> tuple[float, int]:
    """Decode tok/s and tokens of one greedy row."""
    marks, counts = [], []

    def emit(event):
        if isinstance(event, TextDelta) and not marks:
            marks.append(time.perf_counter())
        elif isinstance(event, RowFinished):
            marks.append(time.perf_counter())
            counts.append(event.completion_tokens)

    spec = RowSpec(
        prompt_ids=tuple(prompt),
        sampling=SamplingParams(temperature=0.0),
        max_tokens=tokens,
        constraint=constraint,
    )
    run_job(lm, GenerationJob(rows=[spec], emit=emit))
    return (counts[0] - 1) / (marks[-1] - marks[0]), counts[0]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="millm-bench-"))
    lm = load_model(demo_source(), dtype=args.dtype, device="cpu", cache_root=home / "cache")
    prompt = chat_prompt_ids(lm.tokenizer, MESSAGES)
    spec = GrammarSpec(json.dumps(SCHEMA))

    start = time.perf_counter()
    lm.grammar.tokenizer  # noqa: B018 - the once-per-model tokenizer set-up
    setup_s = time.perf_counter() - start
    compiles = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        lm.grammar.matcher(spec).mask(torch.zeros(lm.vocab_size))  # compile + first mask
        compiles.append((time.perf_counter() - start) * 1000)

    constrained, lengths = [], []
    for _ in range(args.repeats):
        rate, count = run(lm, prompt, 300, spec)
        constrained.append(rate)
        lengths.append(count)
    free_lm = replace(lm, eos_token_ids=frozenset())
    free = [
        run(free_lm, prompt, int(statistics.median(lengths)), None)[0] for _ in range(args.repeats)
    ]

    print(
        f"\nSmolLM2-135M-Instruct, {lm.dtype_name} ({lm.runner.kernels}), greedy, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} runs each"
    )
    print("| measure | best | median |")
    print("|---|---|---|")
    print(f"| llguidance tokenizer set-up, once per model (s) | {setup_s:.2f} | - |")
    print(
        f"| schema compile + first mask (ms) | {min(compiles):.2f} | "
        f"{statistics.median(compiles):.2f} |"
    )
    print(f"| unconstrained decode (tok/s) | {max(free):.1f} | {statistics.median(free):.1f} |")
    print(
        f"| constrained decode, {int(statistics.median(lengths))}-token document (tok/s) | "
        f"{max(constrained):.1f} | {statistics.median(constrained):.1f} |"
    )
    print(
        "\nconstrained / unconstrained (medians) = "
        f"{statistics.median(constrained) / statistics.median(free):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
