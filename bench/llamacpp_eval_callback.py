"""What a graph evaluation callback (cb_eval) costs llama.cpp's decode on the demo's Q4_1 file,
before it observes anything: the way residual reads on the llama.cpp engine would have to go.

Each run is a fresh process (the callback is fixed when the context is created): llama-cpp-python's
low-level API, a 2,048-token context, the chat prompt, then 128 greedy tokens one decode at a time,
with no callback ("off") or with a Python callback that answers "not needed" for every node
("idle"); runs alternate, and the table gives each mode's median and best.

    .venv/bin/python bench/llamacpp_eval_callback.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from millm.engine.sources import demo_source  # noqa: E402

RUN = r"""
import ctypes, json, sys, time
import numpy as np
import llama_cpp as L

path, mode, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
calls = [0]

@L.ggml_backend_sched_eval_callback
def observe_nothing(tensor, ask, user_data):
    calls[0] += 1
    return False

L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
params = L.llama_context_default_params()
params.n_ctx, params.n_batch, params.n_ubatch, params.n_threads, params.n_threads_batch = 2048, 512, 512, threads, threads
if mode == "idle":
    params.cb_eval = observe_nothing
ctx = L.llama_init_from_model(model, params)
vocab = L.llama_model_get_vocab(model)
prompt = b"<|im_start|>user\nTell me about your weekend.<|im_end|>\n<|im_start|>assistant\n"
ids = (L.llama_token * 256)()
n = L.llama_tokenize(vocab, prompt, len(prompt), ids, 256, False, True)
batch = L.llama_batch_init(512, 0, 1)

def decode(tokens, first):
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, first + i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
    assert L.llama_decode(ctx, batch) == 0

decode(list(ids[:n]), 0)
width, position = L.llama_vocab_n_tokens(vocab), n
start = time.perf_counter()
for _ in range(128):
    token = int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(width,)).argmax())
    decode([token], position)
    position += 1
print(json.dumps({"tok_s": 128 / (time.perf_counter() - start), "calls_per_decode": calls[0] / 129}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    import torch

    source = demo_source()
    path, threads = str(source.directory / source.gguf_file), torch.get_num_threads()
    results: dict[str, list[dict]] = {"off": [], "idle": []}
    for _ in range(args.runs):
        for mode in results:
            out = subprocess.run(
                [sys.executable, "-c", RUN, path, mode, str(threads)],
                capture_output=True,
                text=True,
                check=True,
            )
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"\ndemo Q4_1 file, 128 greedy tokens, {threads} threads, {args.runs} runs per mode (alternating)"
    )
    print("| cb_eval | median tok/s | best tok/s | callback calls per decode |")
    print("|---|---|---|---|")
    for mode, runs in results.items():
        rates = [r["tok_s"] for r in runs]
        print(
            f"| {mode} | {statistics.median(rates):.1f} | {max(rates):.1f} | {runs[0]['calls_per_decode']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
