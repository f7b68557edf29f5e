"""The llama.cpp engine that sees: what reads, probes and per-row steering cost on llama.cpp's
kernels.

On the demo's own Q4_1 GGUF file, one run, the same thread count everywhere:
(b) llama-cpp-python's own create_completion (streaming), unsteered, in a process of its own (the
    reference: llama.cpp as its users run it; bench/llamacpp_engine.py's script);
then one millm server, --engine llama.cpp, continuous batching of up to 8 rows, HTTP streaming:
(a0) nothing asked; (a1) one feature steered (the request's own steering) + 16 features read at
every generated position + one probe watching; (a8) 8 concurrent streams unsteered, aggregate;
(a8s) 8 concurrent streams each with its own steering (8 distinct plans in one batch);
(a8r) 8 concurrent streams read by monitoring (16 features at every generated position) and each
watched by a probe (a request's own return_sae_activations runs on the serial path, as the API
says, so batched reading is monitoring's);
and (c) millm on transformers (the default engine) doing (a1), for reference.
Single-stream decode tok/s excludes the first token and is the best of --repeats runs; an
aggregate is every stream's tokens over the wall time from first request to last answer.

    .venv/bin/python bench/llamacpp_sees.py [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decode_speed import PROMPT  # noqa: E402
from bench.llamacpp_engine import WINDOW, llama_cpp_python, sae_of  # noqa: E402
from millm.engine.sources import demo_source  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PIRATE = 1403  # the demo SAE's pirate feature
READ = [PIRATE, *range(100, 1600, 100)]  # 16 features
STEERED = [PIRATE, 454, 667, 1023, 1727, 523, 896, 2009]  # one per stream of (a8s)


def stream(base_url: str, tokens: int, extra: dict | None) -> tuple[float, int, float]:
    """One streamed completion: (decode tok/s after the first token, tokens, seconds in all)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=600)
    start, first, usage = time.perf_counter(), None, None
    for chunk in client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    ):
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter()
        if chunk.usage:
            usage = chunk.usage.completion_tokens
    end = time.perf_counter()
    assert first is not None and usage is not None
    return (usage - 1) / (end - first), usage, end - start


def best(base_url: str, tokens: int, extra: dict | None, repeats: int) -> float:
    """The best single-stream decode rate of `repeats` runs after a warm-up."""
    stream(base_url, tokens, extra)
    return max(stream(base_url, tokens, extra)[0] for _ in range(repeats))


def aggregate(base_url: str, tokens: int, extras: list[dict | None]) -> float:
    """Tokens per second of one concurrent stream per entry of `extras`, together."""
    with ThreadPoolExecutor(len(extras)) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda extra: stream(base_url, tokens, extra), extras))
        elapsed = time.perf_counter() - start
    return sum(r[1] for r in results) / elapsed


def sees(sae: str, steer: int | None) -> dict:
    """A request body's extra: 16 features read at each generated position, a probe, and
    optionally a steered feature."""
    extra: dict = {
        "return_sae_activations": {"sae_id": sae, "features": READ, "top_k": len(READ)},
        "probes": [
            {
                "name": "pirate",
                "detector": {"type": "feature", "sae_id": sae, "index": PIRATE, "threshold": 5.0},
            }
        ],
    }
    if steer is not None:
        extra["steering"] = {
            "steering": [{"sae_id": sae, "features": [{"index": steer, "strength": 30.0}]}]
        }
    return extra


def steering_only(sae: str, feature: int) -> dict:
    """A request body's extra steering one feature."""
    return {
        "steering": {
            "steering": [{"sae_id": sae, "features": [{"index": feature, "strength": 30.0}]}]
        }
    }


def callback_cost(
    path: Path, threads: int, steps: int = 256, rounds: int = 5
) -> tuple[float, float]:
    """Milliseconds a one-token llama_decode takes without and with millm's callback (nothing
    hooked)."""
    from millm.engine.graph_callback import GraphHooks, ggml_library
    from millm.engine.runner_llamacpp import bindings

    lib = bindings()
    lib.llama_backend_init()
    model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
    hooks = GraphHooks(ggml_library(), lambda index, values: None, Path(tempfile.mkdtemp()))
    contexts = []
    for hooked in (False, True):
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_threads, params.n_threads_batch = 1024, threads, threads
        if hooked:
            params.cb_eval = ctypes.cast(hooks.callback, type(params.cb_eval))
            params.cb_eval_user_data = hooks.user_data
        contexts.append(lib.llama_init_from_model(model, params))
    batch = lib.llama_batch_init(1, 0, 1)
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for which, ctx in enumerate(contexts):
            lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
            start = time.perf_counter()
            for position in range(steps):
                batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = (
                    1,
                    position,
                    1,
                    True,
                )
                batch.seq_id[0][0] = 0
                batch.n_tokens = 1
                assert lib.llama_decode(ctx, batch) == 0
            times[which].append((time.perf_counter() - start) * 1000 / steps)
    lib.llama_batch_free(batch)
    for ctx in contexts:
        lib.llama_free(ctx)
    lib.llama_model_free(model)
    return min(times[0]), min(times[1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    source = demo_source()
    path = source.directory / source.gguf_file
    tokens = args.tokens

    reference = llama_cpp_python(path, threads, tokens, args.repeats)["tok_s"]

    env = {"ENABLE_CONTINUOUS_BATCHING": "1", "MAX_BATCH_SIZE": "8"}
    figures: dict[str, float] = {}
    server = ServerProcess(
        Path(tempfile.mkdtemp(prefix="millm-bench-sees-")),
        ["--engine", "llama.cpp", "--max-model-len", str(WINDOW), "--log-level", "warning"],
        env=env,
    ).wait_ready(timeout=600)
    try:
        url = server.base_url
        sae = sae_of(url)
        figures["a0"] = best(url, tokens, None, args.repeats)
        figures["a1"] = best(url, tokens, sees(sae, PIRATE), args.repeats)
        aggregate(url, 16, [None] * 2)  # warm-up of the batched path
        figures["a8"] = aggregate(url, tokens, [None] * 8)
        figures["a8s"] = aggregate(url, tokens, [steering_only(sae, f) for f in STEERED])
        monitoring = {
            "enabled": True,
            "features": READ,
            "top_k": len(READ),
            "positions": "completion",
        }
        httpx.put(f"{url}/api/monitoring", json=monitoring, timeout=30).raise_for_status()
        figures["a8r"] = aggregate(url, tokens, [{"probes": sees(sae, None)["probes"]}] * 8)
    finally:
        server.stop()

    server = ServerProcess(
        Path(tempfile.mkdtemp(prefix="millm-bench-sees-hf-")), ["--log-level", "warning"]
    ).wait_ready(timeout=600)
    try:
        figures["c1"] = best(
            server.base_url, tokens, sees(sae_of(server.base_url), PIRATE), args.repeats
        )
    finally:
        server.stop()

    rows = [
        ("(b) llama-cpp-python create_completion, unsteered", reference, "", ""),
        (
            "(a0) millm on llama.cpp, nothing asked",
            figures["a0"],
            f"{figures['a0'] / reference:.2f}x (b)",
            ">= 1.0x (b)",
        ),
        (
            "(a1) one feature steered + 16 read + a probe",
            figures["a1"],
            f"{figures['a1'] / reference:.2f}x (b)",
            ">= 1.0x (b)",
        ),
        (
            "(c) millm on transformers doing (a1)",
            figures["c1"],
            f"{figures['c1'] / reference:.2f}x (b)",
            "",
        ),
        ("(a8) 8 streams unsteered, aggregate", figures["a8"], "", ""),
        (
            "(a8s) 8 streams, 8 distinct steerings",
            figures["a8s"],
            f"{figures['a8s'] / figures['a8']:.2f}x (a8)",
            ">= 0.9x (a8)",
        ),
        (
            "(a8r) 8 streams monitored and probed",
            figures["a8r"],
            f"{figures['a8r'] / figures['a8']:.2f}x (a8)",
            ">= 0.9x (a8)",
        ),
    ]
    plain, hooked = callback_cost(path, threads)
    print(
        f"\n{MODEL} Q4_1 GGUF, {tokens} new tokens, greedy, {threads} threads, best of "
        f"{args.repeats}"
    )
    print(f"| {'path':<50} | tok/s  | ratio | goal |")
    print(f"|{'-' * 52}|--------|-------|------|")
    for name, rate, ratio, goal in rows:
        print(f"| {name:<50} | {rate:6.1f} | {ratio} | {goal} |")
    print(
        f"\none-token llama_decode, best of 5 x 256: {plain:.3f} ms without a callback, "
        f"{hooked:.3f} ms with millm's (nothing hooked): {hooked / plain:.3f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
