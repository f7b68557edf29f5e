"""The llama.cpp engine against llama-cpp-python and against millm's transformers engine, one run,
one table.

On the demo's own Q4_1 GGUF file:
(a) millm on llama.cpp (--engine llama.cpp) through HTTP streaming, one stream;
(b) llama-cpp-python's own create_completion (streaming) on the same file and thread count, in a
    process of its own that imports nothing else (the reference: llama.cpp as its users run it);
(c) millm on transformers (the default engine) through HTTP streaming;
then on (a)'s server: 8 concurrent streams (continuous batching) in aggregate, the same single
stream with one feature steered (inside llama.cpp's graph), and each server's resident memory after
load (VmRSS, before any request) beside (b)'s process and beside millm's runtime alone (a process
importing what the server imports, no model: the "runtime's baseline"). (a) and (b) both hold a
2,048-token window (--max-model-len 2048 for (a); llama.cpp allocates its KV cache whole, so the
window is part of the memory figure). Decode tok/s excludes the first token; each single-stream
figure is the best of --repeats runs.

    .venv/bin/python bench/llamacpp_engine.py [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decode_speed import PROMPT, http_run  # noqa: E402
from millm.engine.sources import demo_source  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PIRATE = 1403  # the demo SAE's pirate feature (the demo's pirate profile steers it at 40)

REFERENCE = """
import json, resource, sys, time
from llama_cpp import Llama
path, prompt = sys.argv[1], sys.argv[5]
threads, tokens, repeats = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
rates = []
for _ in range(repeats + 1):
    start, first, count = time.perf_counter(), None, 0
    pieces = llm.create_completion(
        prompt, max_tokens=tokens, temperature=0, repeat_penalty=1.0, stream=True
    )
    for piece in pieces:
        if piece["choices"][0]["finish_reason"] is not None:
            continue
        count += 1
        first = first or time.perf_counter()
    rates.append((count - 1) / (time.perf_counter() - first))
print(json.dumps({"tok_s": max(rates[1:]), "rss": rss, "tokens": count}))
"""


BASELINE = """
import millm.server.app, millm.engine.loader_llamacpp, millm.engine.runner_llamacpp
import llama_cpp, torch, transformers
print(int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024)
"""
WINDOW = 2048  # (b)'s n_ctx


def rss(server: ServerProcess) -> int:
    """The server process's resident memory now, in bytes."""
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
        * 1024
    )


def best(run, repeats: int) -> float:
    run()  # warm-up
    return max(run()[1] for _ in range(repeats))


def aggregate(base_url: str, streams: int, tokens: int) -> float:
    """Tokens per second of `streams` concurrent streams together (first token to last)."""
    with ThreadPoolExecutor(streams) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda _: http_run(base_url, MODEL, tokens), range(streams)))
        elapsed = time.perf_counter() - start
    return sum(r[2] for r in results) / elapsed


def sae_of(base_url: str) -> str:
    """The id of the server's first registered SAE (the demo SAE on a demo server)."""
    return httpx.get(f"{base_url}/api/saes", timeout=30).json()["data"][0]["id"]


def steer(base_url: str, strength: float) -> None:
    """Set (or with 0, clear) the pirate feature live on the demo SAE."""
    body = {"features": [{"sae_id": sae_of(base_url), "index": PIRATE, "strength": strength}]}
    httpx.post(f"{base_url}/api/steering/features", json=body, timeout=30).raise_for_status()


def llama_cpp_python(path: Path, threads: int, tokens: int, repeats: int) -> dict:
    """The reference: llama-cpp-python's own streaming completion of PROMPT, in a process of its
    own that imports nothing else; its best decode tok/s, resident memory and token count."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            REFERENCE,
            str(path),
            str(threads),
            str(tokens),
            str(repeats),
            PROMPT,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    rows = []

    home = Path(tempfile.mkdtemp(prefix="millm-bench-cpp-"))
    env = {"ENABLE_CONTINUOUS_BATCHING": "1", "MAX_BATCH_SIZE": "8"}
    server = ServerProcess(
        home,
        ["--engine", "llama.cpp", "--max-model-len", str(WINDOW), "--log-level", "warning"],
        env=env,
    ).wait_ready(timeout=600)
    try:
        time.sleep(2)
        cpp_rss = rss(server)
        single = best(lambda: http_run(server.base_url, MODEL, args.tokens), args.repeats)
        aggregate(server.base_url, 2, 16)  # warm-up of the batched path
        eight = aggregate(server.base_url, 8, args.tokens)
        steer(server.base_url, 40.0)
        steered = best(lambda: http_run(server.base_url, MODEL, args.tokens), args.repeats)
        steer(server.base_url, 0.0)
    finally:
        server.stop()

    reference = llama_cpp_python(path, threads, args.tokens, args.repeats)

    home = Path(tempfile.mkdtemp(prefix="millm-bench-hf-"))
    server = ServerProcess(home, ["--log-level", "warning"]).wait_ready(timeout=600)
    try:
        time.sleep(2)
        hf_rss = rss(server)
        hf = best(lambda: http_run(server.base_url, MODEL, args.tokens), args.repeats)
    finally:
        server.stop()

    baseline = int(
        subprocess.run(
            [sys.executable, "-c", BASELINE], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    )
    size = path.stat().st_size
    rows = [
        (
            "(a) millm, --engine llama.cpp, HTTP stream",
            single,
            cpp_rss,
            f"{single / reference['tok_s']:.2f}x (b), {single / hf:.2f}x (c)",
        ),
        ("(b) llama-cpp-python create_completion", reference["tok_s"], reference["rss"], ""),
        ("(c) millm, --engine transformers, HTTP stream", hf, hf_rss, ""),
        ("(a) 8 concurrent streams, aggregate", eight, None, f"{eight / single:.2f}x (a)"),
        ("(a) one feature steered", steered, None, f"{steered / single:.2f}x (a)"),
    ]
    print(
        f"\n{MODEL} Q4_1 GGUF ({size / 2**20:.0f} MiB), {args.tokens} new tokens, greedy, "
        f"{threads} threads, best of {args.repeats}"
    )
    print(f"| {'path':<46} | tok/s  | RSS after load | ratio |")
    print(f"|{'-' * 48}|--------|----------------|-------|")
    for name, rate, memory, ratio in rows:
        shown = f"{memory / 2**20:8.0f} MiB" if memory else ""
        print(f"| {name:<46} | {rate:6.1f} | {shown:>14} | {ratio} |")
    goal = 2 * size + baseline
    print(
        f"\nmillm's runtime alone (imports, no model): {baseline / 2**20:.0f} MiB; (a)'s RSS "
        f"goal, 2x the file plus that: {goal / 2**20:.0f} MiB; (a) holds {cpp_rss / 2**20:.0f} "
        f"MiB ({cpp_rss / goal:.2f}x the goal)"
    )
    print("goals: (a) >= 0.9x (b), (a) >= 1.5x (c); 8 streams >= 3x (a); steered >= 0.95x (a)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
