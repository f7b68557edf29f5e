"""Issue 36's goals on the demo model, every figure beside its reference from the same run.

One process: the demo model as the server loads it (dtype auto: bf16 with the int4 kernel over
the GGUF file's own 4-bit codes, the lean runner) and llama-cpp-python on that same GGUF file,
both on torch's thread count. Every millm figure runs through the engine's own jobs (greedy, EOS
ignored so every row decodes --tokens tokens); decode tok/s excludes each row's first token.
Runs alternate (reference, then each variant, --repeats times) so drift on a shared machine hits
all alike; ratios are of medians.

  single stream      millm unsteered / llama.cpp                                   goal >= 1.0 8
  streams          8 jobs on the batched scheduler / 1 job on it (aggregate)     goal >= 6 one
  feature        one demo-SAE feature added / unsteered                        goal >= 0.98 16
  features read   the SAE layer's residual read every step, 16 features encoded goal >= 0.95 probes
  two watches (report, and steer once it fires) / unwatched      goal >= 0.95 prefill
  2,000-token prompt, tokens/s, millm / llama.cpp                (today's: docs/engine.md)

    .venv/bin/python bench/decode_goals.py [--tokens 96] [--repeats 3] [--prefill 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_speed import PROMPT  # noqa: E402
from probe_overhead import GREEDY, Probe, completion_scores  # noqa: E402
from steering_speed import demo_model_and_sae  # noqa: E402

from millm.engine.generate import run_job  # noqa: E402
from millm.engine.jobs import (  # noqa: E402
    GenerationJob,
    ResidualRead,
    RowFinished,
    RowSpec,
    TextDelta,
    Watch,
)
from millm.engine.scheduler import Scheduler  # noqa: E402
from millm.interp.steering import Attached, steering_edit  # noqa: E402

FEATURE = 100  # a demo-SAE feature (any will do: the cost of adding one does not depend on it)
READ_FEATURES = list(range(16))


class Clock:
    """Decode tok/s over jobs: from the first token of any row to the last row's end."""

    def __init__(self, rows: int):
        self.rows, self.marks, self.counts = rows, [], []
        self.done = threading.Event()

    def emit(self, event) -> None:
        if isinstance(event, TextDelta) and not self.marks:
            self.marks.append(time.perf_counter())
        elif isinstance(event, RowFinished):
            self.counts.append(event.completion_tokens)
            if len(self.counts) == self.rows:
                self.marks.append(time.perf_counter())
                self.done.set()

    @property
    def rate(self) -> float:
        return sum(c - 1 for c in self.counts) / (self.marks[-1] - self.marks[0])


def serial_rate(lm, spec: RowSpec) -> float:
    """One row's decode tok/s, run as one job on the scheduler thread's path (no queue)."""
    clock = Clock(1)
    run_job(lm, GenerationJob(rows=[spec], emit=clock.emit))
    return clock.rate


def streams_rate(scheduler: Scheduler, spec: RowSpec, streams: int) -> float:
    """Aggregate decode tok/s of `streams` jobs submitted at once to a batched scheduler."""
    clock = Clock(streams)
    for _ in range(streams):
        scheduler.submit(GenerationJob(rows=[spec], emit=clock.emit))
    assert clock.done.wait(600), "the streams did not finish"
    return clock.rate


def llama_cpp_rate(llm, tokens: int) -> float:
    """llama-cpp-python's decode tok/s on the same prompt (its first token excluded)."""
    first, count = None, 0
    for piece in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0, stream=True):
        if piece["choices"][0]["finish_reason"] is not None:
            continue
        count += 1
        if first is None:
            first = time.perf_counter()
    assert first is not None
    return (count - 1) / (time.perf_counter() - first)


def prefill_rates(lm, llm, length: int, repeats: int) -> tuple[float, float]:
    """Prefill tokens/s of a `length`-token prompt: millm's lean runner, llama.cpp (best of
    repeats)."""
    words = " ".join(str(i) for i in range(length))
    ids = lm.tokenizer(words)["input_ids"][:length]
    ours, theirs = [], []
    for _ in range(repeats):
        with torch.inference_mode():
            start = time.perf_counter()
            lm.runner.prefill([ids], capacity=length + 8)
            ours.append(length / (time.perf_counter() - start))
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        theirs.append(length / (time.perf_counter() - start))
    return max(ours), max(theirs)


@dataclass
class Goal:
    name: str
    reference: str
    goal: float
    figures: list[float]
    references: list[float]

    def row(self) -> str:
        ratio = statistics.median(self.figures) / statistics.median(self.references)
        met = "met" if ratio >= self.goal else "**missed**"
        return (
            f"| {self.name} | {statistics.median(self.figures):.1f} | {self.reference}: "
            f"{statistics.median(self.references):.1f} | {ratio:.2f}× | ≥ {self.goal}× {met} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=2000)
    args = parser.parse_args()
    from llama_cpp import Llama

    lm, info, sae = demo_model_and_sae("auto")
    llm = Llama(
        str(lm.source.directory / lm.source.gguf_file),
        n_ctx=max(1024, args.prefill + 64),
        n_threads=torch.get_num_threads(),
        verbose=False,
    )
    point = info.layer
    attached = {info.id: Attached(info, sae, point)}
    prompt = tuple(lm.tokenizer(PROMPT)["input_ids"])
    plain = RowSpec(prompt_ids=prompt, sampling=GREEDY, max_tokens=args.tokens)
    steered = replace(plain, edit=steering_edit({info.id: {FEATURE: 4.0}}, attached))
    encode = lambda x: sae.encode(x.to(sae.W_dec.dtype))[:, READ_FEATURES]
    read = replace(
        plain, reads=(ResidualRead(point, False, "completion", "monitoring", encode=encode),)
    )
    direction = sae.W_dec[FEATURE].float()
    probe = Probe((direction / direction.norm()).to(lm.device), 0.5)
    scores = completion_scores(lm, plain, point, probe)
    watched = replace(
        plain,
        watches=(
            Watch("report", point, probe, float(scores.quantile(0.75))),
            Watch(
                "steer",
                point,
                probe,
                float(scores.median()),
                "steer",
                edit=steering_edit({info.id: {FEATURE: 4.0}}, attached),
            ),
        ),
    )
    scheduler = Scheduler(lm, 64, batching=True, max_batch=8)
    variants = {"steered": steered, "read": read, "watched": watched}
    series: dict[str, list[float]] = {
        k: [] for k in ("llama", "plain", *variants, "one stream", "8 streams")
    }
    warm = replace(plain, max_tokens=8)
    for spec in (warm, *(replace(v, max_tokens=8) for v in variants.values())):
        serial_rate(lm, spec)
    llama_cpp_rate(llm, 8)
    load_before = os.getloadavg()[0]
    try:
        for _ in range(args.repeats):
            series["llama"].append(llama_cpp_rate(llm, args.tokens))
            series["plain"].append(serial_rate(lm, plain))
            for name, spec in variants.items():
                series[name].append(serial_rate(lm, spec))
            series["one stream"].append(streams_rate(scheduler, plain, 1))
            series["8 streams"].append(streams_rate(scheduler, plain, 8))
    finally:
        scheduler.shutdown(timeout=60)
    ours, theirs = prefill_rates(lm, llm, args.prefill, args.repeats)

    print(
        f"\nSmolLM2-135M-Instruct, {lm.dtype_name} ({lm.runner.kernels}) against llama-cpp-python "
        f"on the same GGUF file; {args.tokens} greedy tokens a row, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {args.repeats} alternating rounds, load average "
        f"{load_before:.2f} -> {os.getloadavg()[0]:.2f}\n"
    )
    print("| goal | millm tok/s (median) | reference, same run | ratio | goal |")
    print("|---|---|---|---|---|")
    goals = [
        Goal("single stream, unsteered", "llama.cpp", 1.0, series["plain"], series["llama"]),
        Goal(
            "8 streams (aggregate)",
            "one stream",
            6.0,
            series["8 streams"],
            series["one stream"],
        ),
        Goal("one feature steered", "unsteered", 0.98, series["steered"], series["plain"]),
        Goal("16 features read", "unsteered", 0.95, series["read"], series["plain"]),
        Goal(
            "probes (report + steer watch)", "unsteered", 0.95, series["watched"], series["plain"]
        ),
    ]
    for goal in goals:
        print(goal.row())
    print(
        f"| prefill, {args.prefill} tokens (tokens/s, best) | {ours:.0f} | llama.cpp: {theirs:.0f} "
        f"| {ours / theirs:.2f}× | not slower than today's (docs/engine.md) |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
