"""Time and memory of an attribution graph on the demo model, beside a plain forward pass.

In process: the demo model (SmolLM2-135M-Instruct, the GGUF's weights as the server loads them,
bf16 by default) and the demo SAE after block 12 (2048 features, TopK 32), or with
--sources transcoders the demo transcoder set (320 JumpReLU features on each of the 30 blocks:
the exact kind, attention and norms held). For each prompt
length (the capital-of-France sentence, and a paragraph cut to --long tokens) and each
--nodes budget, a graph is traced as POST /api/attribution traces it (replacement pass, the
target's row, expansion by influence, pruning), then its top 8 features are ablated on the
served runner (the check). Each configuration runs in a fresh process: timed over --repeats
runs (the median), its memory the peak resident size above the process's size with the model
loaded, sampled every 10 ms (the float32 copy of the weights the pass runs on included). The
reference in the same run is one served forward pass of the same prompt (the runner's
prompt_logits).

    .venv/bin/python bench/attribution_graph.py [--dtype bfloat16] [--nodes 64 128 256]
        [--long 64] [--repeats 3] [--sources sae|transcoders] [--integrated-gradients 0 8]
        [--prompts short long]

With --integrated-gradients, each budget runs once per number of steps (0: gradient x
activation), so the check's correlation can be read beside the default's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.engine.loader import load_model  # noqa: E402
from millm.engine.sources import resolve_source  # noqa: E402
from millm.interp.attribution.graph import Budget, Target, Tracer  # noqa: E402
from millm.interp.attribution.replacement import (  # noqa: E402
    ReplacementModel,
    Source,
    plain_source,
)
from millm.interp.attribution.verify import verify  # noqa: E402
from millm.interp.formats import read_saelens  # noqa: E402
from millm.interp.transcoders import read_transcoder_set  # noqa: E402
from millm.settings import DEMO_MODEL_NAME  # noqa: E402

DEMO_SAE = ROOT / "millm" / "demo" / "sae" / "smollm2-135m-topk"
DEMO_TRANSCODERS = ROOT / "millm" / "demo" / "transcoders" / "smollm2-135m-jumprelu"
SHORT = "The capital of France is"
PARAGRAPH = (
    "The harbour town woke slowly. Fishing boats rocked against the pier while gulls argued over "
    "the morning catch, and the baker on the corner pulled the first loaves from a stone oven. "
    "Down by the water an old captain mended his nets, telling anyone who would listen about the "
    "storms he had sailed through, the islands he had seen and the treasure he never found."
)


def rss() -> int:
    """This process's resident size in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Peak:
    """The peak resident size above the starting one while the block runs."""

    def __enter__(self) -> Peak:
        self.start, self.peak, self.done = rss(), 0, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.done.wait(0.01):
            self.peak = max(self.peak, rss() - self.start)

    def __exit__(self, *_) -> None:
        self.done.set()
        self.thread.join()


def demo(dtype: str, kind: str):
    """The demo model and the graph's feature sources (the demo SAE, or the demo transcoder set)."""
    home = Path.home() / ".cache" / "millm-bench"
    source = resolve_source(DEMO_MODEL_NAME, home / "hub")
    lm = load_model(source, dtype=dtype, device="cpu", cache_root=home / "cache")
    if kind == "transcoders":
        found = read_transcoder_set(DEMO_TRANSCODERS).layers
        return lm, [Source(f"demo/{layer}", sae, layer, "mlp") for layer, sae in found.items()]
    return lm, [Source("demo", read_saelens(DEMO_SAE)[1], 12, "resid")]


def graph_once(
    lm, given: list[Source], prompt: list[int], target: Target, nodes: int, steps: int = 0
):
    """One graph as the service computes it (a fresh replacement model: its weights copy
    included)."""
    model = ReplacementModel(lm.runner.layout)
    sources = [plain_source(source, model.dtype) for source in given]
    tracer = Tracer(model, prompt, sources, target, Budget(nodes), steps=steps)
    tracer.start()
    while tracer.expand():
        pass
    graph = tracer.finish()
    top = torch.argsort(graph.pruned.influence[: len(graph.features)], descending=True)[:8]
    with torch.inference_mode():
        checked = verify(lm, graph, [int(i) for i in top], None)
    return graph, checked


def measure(
    dtype: str, kind: str, text: str, cut: int, nodes: int, repeats: int, steps: int = 0
) -> tuple:
    """In a fresh process (so the peak is this configuration's alone): the forward's median time,
    the graph's median time, the features expanded, the peak memory above the loaded model, r."""
    lm, sources = demo(dtype, kind)
    prompt = lm.tokenizer(text)["input_ids"][:cut]
    with torch.inference_mode():
        top = int(lm.runner.prompt_logits([*prompt, 0], len(prompt))[-1].argmax())
        forward = []
        for _ in range(repeats):
            started = time.perf_counter()
            lm.runner.prompt_logits([*prompt, 0], len(prompt))
            forward.append(time.perf_counter() - started)
    times = []
    with Peak() as peak:
        for _ in range(repeats):
            started = time.perf_counter()
            graph, checked = graph_once(lm, sources, prompt, Target((top,), (1.0,)), nodes, steps)
            times.append(time.perf_counter() - started)
    return (
        len(prompt),
        statistics.median(forward),
        statistics.median(times),
        len(graph.features),
        peak.peak,
        checked.correlation,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--long", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sources", choices=["sae", "transcoders"], default="sae")
    parser.add_argument(
        "--integrated-gradients",
        type=int,
        nargs="+",
        default=[0],
        help="integrated gradients' steps per point (0: gradient x activation); one row each",
    )
    parser.add_argument(
        "--prompts", nargs="+", choices=["short", "long"], default=["short", "long"]
    )
    args = parser.parse_args()
    what = "demo SAE after block 12" if args.sources == "sae" else "demo transcoder set (30 blocks)"
    print(f"demo model ({args.dtype}), {what}; {torch.get_num_threads()} threads")
    print(
        "| prompt | tokens | nodes | IG steps | forward (ms) | graph + check (s) | expanded | "
        "peak memory (MiB) | check r |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    context = multiprocessing.get_context("spawn")
    prompts = {"short": (SHORT, 10_000), "long": (PARAGRAPH, args.long)}
    for name in args.prompts:
        text, cut = prompts[name]
        for nodes in args.nodes:
            for steps in args.integrated_gradients:
                with context.Pool(1) as pool:
                    tokens, forward, graph, expanded, peak, r = pool.apply(
                        measure, (args.dtype, args.sources, text, cut, nodes, args.repeats, steps)
                    )
                shown = "—" if r is None else f"{r:.2f}"
                print(
                    f"| {name} | {tokens} | {nodes} | {steps} | {1000 * forward:.0f} | "
                    f"{graph:.2f} | {expanded} | {peak / 2**20:.0f} | {shown} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
