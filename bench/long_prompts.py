"""Long prompts: the prefix cache, chunked prefill and prefill speed, on the demo model. One run,
one report of four markdown tables.

The demo model (SmolLM2-135M-Instruct, Q4_1 GGUF) as the server loads it by default: dtype auto
(bf16 on the CPU, with int4 kernels over the file's 4-bit codes), the lean runner. Everything runs
in process through millm's Scheduler (GenerationJob, greedy), as bench/families_speed.py does; TTFT
is the time from `submit` to the row's first event (its first TextDelta, or a RowFinished when
the first token releases no text). The prefix cache holds --cache-bytes (PREFIX_CACHE_BYTES).

  1. Second chat turn over a long history: a conversation of ~--history tokens (notes the user
     shares, answers), turn 1 generated (the cache stores its prompt and answer), then turn 2 =
     history + turn 1's answer + a new question. TTFT of turn 2 with the cache off
     (PREFIX_CACHE_BYTES=0) and on, each run in a process of its own; serial policy (continuous
     batching off, the server's default). Goal: on <= 0.2 x off.
  2. An Open WebUI-shaped request: a long system prompt (~--system tokens: a RAG template with
     retrieved sources), five tools rendered as the server renders them for this model (its
     template takes no `tools`, so in the system message, as with MILLM_PROMPTED_TOOLS=on) and a
     short user message. TTFT of the first request (cold), of the same request repeated, and of
     a new user message under the same system prompt and tools. Goal: repeat <= 0.2 x first.
  3. A running stream while a ~--long-tokens prompt joins (continuous batching on): the stream's
     median inter-token gap alone, then the p95 and max of its gaps that overlap the window from
     the long prompt's submission to its first token, for each PREFILL_CHUNK_TOKENS in --chunks
     (100000: chunking effectively off), and the long prompt's own TTFT (what chunking costs it).
     Gaps are between the stream's TextDelta events, as a client sees them. Goal: p95 <= 3 x median.
  4. Prefill tokens/s (one row, LeanRunner.prefill, best of --repeats after a warm-up) at each of
     --sizes: before (kernels.DENSE_ROWS = FLOAT32_COPY_ROWS = 10**9: every pass on the int4
     kernel, the path before the pre-packed copies) and after (the default: a bf16 copy where
     oneDNN pre-packs bf16, else a float32 one), beside llama-cpp-python evaluating
     the same token ids on the same GGUF file (llm.eval, n_batch = the whole prompt, the
     default n_ubatch 512, n_threads = n_threads_batch = torch's thread count), in a process that
     imports nothing else. Goal: after >= 2 x before at 2,000 tokens.

Every measurement runs in its own process (PyTorch's OpenMP pools of two threads in one process
slow each other, see docs/engine.md), with the model loaded on a thread that ends before measuring,
as the server does; each does a warm-up of the same shape first (other tokens, so nothing of it
is reused from the cache). Figures of 1-3 are medians over --repeats distinct prompts.

    .venv/bin/python bench/long_prompts.py [--quick] [--only 1|2|3|4] [--repeats 3] [--work DIR]

--quick runs small sizes (to check the script end to end, not to read figures). --work keeps the
dequantised checkpoint between runs (by default a temporary folder: the first load converts the
GGUF).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "SmolLM2-135M-Instruct"
GIB = 2**30
STREAM_PROMPT = "Here is a list of the numbers from 1 to 3000, separated by commas: 1, 2, 3,"
# seconds: two rows' events of one step come closer than this (a step takes 15 ms or more)
SAME_STEP = 0.005
LLAMA_UBATCH = 512  # llama.cpp's default physical batch

# Varied text the long prompts are made of (notes, sources, questions).
PARAGRAPHS = [
    "The river that runs through the old town floods almost every spring. In 1952 the water "
    "reached the steps of the cathedral, and the council built a stone wall along the eastern "
    "bank. Since then the wall has been raised twice, and the fishermen complain that the current "
    "is now too fast for their nets near the bridge.",
    "Sourdough bread needs three things: flour, water and time. A starter kept at room "
    "temperature must be fed every day, while one kept in the fridge can wait a week. The dough "
    "rises slowly overnight, and a hot oven with steam for the first twenty minutes gives the "
    "crust its colour and its crackle.",
    "Our quarterly report shows revenue up eleven percent against the same quarter last year, "
    "mostly from the new subscription plan. Costs rose faster than expected because of cloud "
    "storage and two new hires in support. The board asked for a plan to bring the margin back "
    "above twenty percent by the end of the year.",
    "Honeybees communicate the direction of food with a waggle dance. The angle of the dance "
    "relative to vertical matches the angle between the sun and the flowers, and the length of "
    "the waggle run tells the distance. A colony can track the sun's movement and correct the "
    "dance over the course of an afternoon.",
    "The train from the coast leaves at seven fifteen and arrives in the capital just before "
    "eleven. On weekends there is an extra service at noon, but it stops at every station and "
    "takes almost an hour longer. Tickets bought online are cheaper, and seat reservations are "
    "free for passengers under twenty-six.",
    "When debugging a memory leak in a long-running service, start by watching the resident set "
    "size over a day. A steady climb that never levels off usually means objects are kept alive "
    "by a cache or a global list. Heap snapshots taken an hour apart, compared by type, often "
    "point straight at the culprit.",
    "The garden behind the library was planted by volunteers in the nineteen seventies. It has a "
    "pond with frogs, a row of apple trees of old varieties and a herb bed that the cooking "
    "school still uses. Every September the library holds a small harvest fair where the apples "
    "are pressed into juice.",
    "Marathon training plans usually build the weekly distance by no more than ten percent at a "
    "time. Long runs are done slowly, at a pace where conversation is still possible, while one "
    "shorter session a week includes intervals. Most injuries come from increasing the load too "
    "quickly rather than from the distance itself.",
    "The museum's new exhibition covers the history of navigation, from star charts and the "
    "astrolabe to the marine chronometer that finally solved the problem of longitude. Visitors "
    "can try a replica sextant on the roof terrace, and a short film explains how ships crossed "
    "the ocean without satellites.",
    "To renew a passport, applicants need the old passport, two recent photographs and the "
    "completed form. The office is open on weekday mornings, and appointments can be booked up to "
    "six weeks ahead. Urgent cases, such as travel for a family emergency, can be handled within "
    "three working days for an extra fee.",
    "Volcanic soils are among the most fertile in the world because the ash weathers into "
    "minerals that plants need. Farmers on the slopes grow coffee, grapes and vegetables, "
    "accepting the risk of an eruption. Monitoring stations measure gas emissions and small "
    "earthquakes to give warning days or weeks before trouble.",
    "The team agreed to move the release to the second week of March. Two features are still "
    "behind: the export to spreadsheets and the new permissions screen. Testing will start on the "
    "first of the month, and the support team will get a walkthrough of every change before "
    "customers see it.",
]
QUESTIONS = [
    "What is the main point of this note?",
    "Can you summarise this in one sentence?",
    "What should I remember from this?",
    "Is there anything surprising here?",
    "Which detail here matters most?",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "web_search",
            "description": "Search the web and return the top results with titles, links and "
            "snippets.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to search for"},
                    "count": {"type": "integer", "description": "How many results, 1-10"},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "The current weather and the forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "description": "Days of forecast, 0-7"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression exactly.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current date and time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {
                    "timezone": {
                        "type": "string",
                        "description": "An IANA name such as Europe/Paris",
                    }
                },
                "required": ["timezone"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fetch_url",
            "description": "Download a web page and return its readable text.",
            "parameters": {
                "type": "object",
                "properties": {"url": {"type": "string"}, "max_chars": {"type": "integer"}},
                "required": ["url"],
            },
        },
    },
]
SIZES = {  # full / --quick
    "history": (2000, 300),
    "answer": (48, 8),
    "system": (1500, 200),
    "long": (4000, 300),
    "alone": (24, 8),
    "chunks": ("64,128,256,512,100000", "64,100000"),
    "sizes": ("500,2000,4000", "64,200"),
    "repeats": (3, 1),
}


# ----------------------------------------------------------------------------------------------
# model
def _load(work: Path, before: bool = False, engine: str = "transformers"):
    """The demo model, loaded on a thread that ends (as the server loads), so the threads that run
    it meet no idle OpenMP pool. `before`: every int4 pass on the int4 kernel (today's prefill).
    `engine`: transformers, or llama.cpp over the same file (sections 1-3)."""
    from millm.engine import kernels
    from millm.engine.loader import load_model
    from millm.engine.loader_llamacpp import load_with_llamacpp
    from millm.engine.sources import resolve_source

    if before:
        kernels.DENSE_ROWS = kernels.FLOAT32_COPY_ROWS = 10**9
    out = {}

    def run():
        source = resolve_source(MODEL, work / "hub")
        if engine == "llama.cpp":
            out["lm"] = load_with_llamacpp(
                source, dtype="auto", cache_root=work / "cache", sequences=16
            )
            return
        out["lm"] = load_model(source, dtype="auto", device="cpu", cache_root=work / "cache")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out["lm"]


def _greedy():
    from millm.engine.sampling import SamplingParams

    return SamplingParams(temperature=0.0)


class Request:
    """One generation job's timing and answer: submit it, wait, read TTFT, text and cached
    tokens."""

    def __init__(self, scheduler, prompt_ids, max_tokens: int):
        from millm.engine.jobs import GenerationJob, RowSpec

        self.text, self.first, self.cached, self.error = "", None, None, None
        self.done = threading.Event()
        spec = RowSpec(prompt_ids=tuple(prompt_ids), sampling=_greedy(), max_tokens=max_tokens)
        self.start = time.perf_counter()
        scheduler.submit(GenerationJob(rows=[spec], emit=self._emit))

    def _emit(self, event) -> None:
        from millm.engine.jobs import JobFailed, RowFinished, TextDelta

        if isinstance(event, (TextDelta, RowFinished)) and self.first is None:
            self.first = time.perf_counter()
        if isinstance(event, TextDelta):
            self.text += event.text
        elif isinstance(event, RowFinished):
            self.cached = event.cached_tokens
            self.done.set()
        elif isinstance(event, JobFailed):
            self.error = event.error
            self.done.set()

    def wait(self) -> Request:
        if not self.done.wait(600):
            raise RuntimeError("a request did not finish within 600 s")
        if self.error is not None:
            raise RuntimeError(f"the request failed: {self.error}")
        return self

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.start


def _tokens(tokenizer, messages, tools=None) -> list[int]:
    """A conversation's prompt ids as the server renders it: tools in the template when it takes
    them, else in a system message (millm.v1.serving.tools, the server's own path)."""
    from millm.engine.prompts import chat_prompt_ids
    from millm.v1.serving.tools import (
        ToolPlan,
        parse_tool,
        template_takes_tools,
        tool_messages,
    )

    if not tools:
        return chat_prompt_ids(tokenizer, messages)
    native = template_takes_tools(tokenizer)
    plan = ToolPlan(tuple(parse_tool(t, i) for i, t in enumerate(tools)), "auto")
    listed = [tool.as_template() for tool in plan.tools] if native else None
    return chat_prompt_ids(tokenizer, tool_messages(messages, plan, native), listed)


def _text(seed, count: int) -> list[str]:
    """`count` paragraphs, shuffled by `seed` (each pass over the list in another order)."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        order = PARAGRAPHS[:]
        rng.shuffle(order)
        out += order
    return out[:count]


def long_ids(tokenizer, n: int, nonce: str) -> list[int]:
    """`n` token ids of plain text, different from the first token on for each nonce."""
    from millm.engine.prompts import completion_prompt_ids

    ids: list[int] = []
    count = 8
    while len(ids) < n:
        ids = completion_prompt_ids(
            tokenizer, f"Document {nonce}.\n\n" + "\n\n".join(_text(nonce, count))
        )
        count *= 2
    return ids[:n]


# ---------------------------------------------------------------------------------------------- 1
def conversation(tokenizer, seed, target: int) -> list[dict]:
    """A chat of notes and answers whose rendered prompt (with a last question) reaches `target`
    tokens."""
    messages = [
        {
            "role": "system",
            "content": f"Session {seed}. You are a careful assistant. The user shares notes; "
            "answer briefly and refer to notes by number.",
        }
    ]
    paragraphs = _text(seed, 400)
    k = 0
    question = {
        "role": "user",
        "content": "Given all the notes so far, which one mentions a river, and what happened "
        "there?",
    }
    while len(_tokens(tokenizer, [*messages, question])) < target:
        note, reply = paragraphs[2 * k], paragraphs[2 * k + 1]
        messages.append(
            {
                "role": "user",
                "content": f"Here is note {k + 1}:\n{note}\n{QUESTIONS[k % len(QUESTIONS)]}",
            }
        )
        messages.append(
            {
                "role": "assistant",
                "content": "In short: " + " ".join(reply.split(". ")[:2]).rstrip(".") + ".",
            }
        )
        k += 1
    return [*messages, question]


def measure_turns(args, cache_on: bool) -> dict:
    from millm.engine.scheduler import Scheduler

    lm = _load(Path(args.work), engine=args.engine)
    scheduler = Scheduler(lm, 64, prefix_cache_bytes=args.cache_bytes if cache_on else 0)
    runs = []
    try:
        for seed in ["warm-up", *range(args.repeats)]:
            messages = conversation(lm.tokenizer, seed, args.history)
            first_ids = _tokens(lm.tokenizer, messages)
            turn1 = Request(scheduler, first_ids, args.answer).wait()
            follow = [
                *messages,
                {"role": "assistant", "content": turn1.text},
                {
                    "role": "user",
                    "content": "Thanks. And which note is about bread, in one sentence?",
                },
            ]
            second_ids = _tokens(lm.tokenizer, follow)
            turn2 = Request(scheduler, second_ids, args.answer).wait()
            if seed != "warm-up":
                runs.append(
                    {
                        "history": len(first_ids),
                        "prompt": len(second_ids),
                        "turn1": turn1.ttft,
                        "turn2": turn2.ttft,
                        "cached": turn2.cached,
                    }
                )
        snapshot = scheduler.prefix_cache.snapshot() if scheduler.prefix_cache is not None else None
    finally:
        scheduler.shutdown(timeout=60)
    return {"runs": runs, "cache": snapshot, "runner": lm.runner.name, "context": lm.context_length}


# ---------------------------------------------------------------------------------------------- 2
def webui_system(tokenizer, seed, target: int) -> str:
    """An Open WebUI-style RAG system prompt of about `target` tokens (retrieved sources in a
    context block)."""
    head = (
        f"Current date: 2025-03-{10 + zlib.crc32(str(seed).encode()) % 18:02d}. You are a helpful "
        "assistant.\n\n### Task:\nRespond to the user query using the provided context, "
        "incorporating inline citations in the format [id] **only when the <source> tag includes "
        "an explicit id attribute**.\n\n### Guidelines:\n- If you don't know the answer, clearly "
        "state that.\n- If uncertain, ask the user for clarification.\n- Respond in the same "
        "language as the user's query.\n- Do not cite if the <source> tag does not contain an "
        "id.\n\n### Context:\n<context>\n"
    )
    sources: list[str] = []
    paragraphs = _text(f"sources-{seed}", 400)
    while True:
        text = head + "".join(sources) + "</context>\n"
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= target:
            return text
        i = len(sources)
        sources.append(f'<source id="{i + 1}" name="notes-{i + 1}.pdf">{paragraphs[i]}</source>\n')


def measure_webui(args) -> dict:
    from millm.engine.scheduler import Scheduler

    lm = _load(Path(args.work), engine=args.engine)
    scheduler = Scheduler(lm, 64, prefix_cache_bytes=args.cache_bytes)
    runs = []
    try:
        for seed in ["warm-up", *range(args.repeats)]:
            system = {"role": "system", "content": webui_system(lm.tokenizer, seed, args.system)}
            ids = _tokens(
                lm.tokenizer,
                [system, {"role": "user", "content": "What does the museum exhibition cover?"}],
                TOOLS,
            )
            other = _tokens(
                lm.tokenizer,
                [system, {"role": "user", "content": "When does the train from the coast arrive?"}],
                TOOLS,
            )
            first = Request(scheduler, ids, args.answer).wait()
            repeat = Request(scheduler, ids, args.answer).wait()
            new = Request(scheduler, other, args.answer).wait()
            if seed != "warm-up":
                runs.append(
                    {
                        "system": len(
                            lm.tokenizer(system["content"], add_special_tokens=False)["input_ids"]
                        ),
                        "prompt": len(ids),
                        "first": first.ttft,
                        "repeat": repeat.ttft,
                        "repeat_cached": repeat.cached,
                        "new": new.ttft,
                        "new_prompt": len(other),
                        "new_cached": new.cached,
                    }
                )
    finally:
        scheduler.shutdown(timeout=60)
    return {"runs": runs}


# ---------------------------------------------------------------------------------------------- 3
def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile (the max under 20 values)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def measure_join(args, chunk: int) -> dict:
    from millm.engine.jobs import GenerationJob, JobFailed, RowFinished, RowSpec, TextDelta
    from millm.engine.prompts import completion_prompt_ids
    from millm.engine.scheduler import Scheduler

    lm = _load(Path(args.work), engine=args.engine)
    lm.eos_token_ids = frozenset()  # the stream runs until cancelled
    n = min(args.long, lm.context_length - 8)
    stream_ids = tuple(completion_prompt_ids(lm.tokenizer, STREAM_PROMPT))
    scheduler = Scheduler(
        lm, 64, batching=True, max_batch=8, prefix_cache_bytes=args.cache_bytes, prefill_chunk=chunk
    )

    def once(nonce) -> dict:
        prompt = long_ids(lm.tokenizer, n, nonce)
        stamps: list[float] = []
        ready, over = threading.Event(), []

        def emit(event):
            if isinstance(event, TextDelta):
                stamps.append(time.perf_counter())
                if len(stamps) == args.alone + 1:
                    ready.set()
            elif isinstance(event, (RowFinished, JobFailed)):
                over.append(time.perf_counter())

        # Enough tokens to outlast the join: one step per chunk, with room to spare.
        budget = args.alone + 2 * math.ceil(n / chunk) + 32
        stream = GenerationJob(
            rows=[RowSpec(prompt_ids=stream_ids, sampling=_greedy(), max_tokens=budget)], emit=emit
        )
        scheduler.submit(stream)
        if not ready.wait(600):
            raise RuntimeError("the stream produced no tokens")
        joined = Request(scheduler, prompt, 1)
        start = joined.start
        joined.wait()
        end = joined.first
        stream.cancel()
        scheduler.wait_idle(60)
        gaps = [(a, b) for a, b in zip(stamps, stamps[1:], strict=False)]
        alone = [b - a for a, b in gaps if b <= start]
        # Every gap that ends after the submission, up to the step that gave the long prompt its
        # first token (the stream's token of that step comes within a millisecond of it).
        window = [b - a for a, b in gaps if start < b <= end + SAME_STEP]
        return {
            "alone": alone,
            "window": window,
            "ttft": joined.ttft,
            "outlasted": not over or over[0] > end,
        }

    try:
        once("warm-up")
        runs = [once(i) for i in range(args.repeats)]
    finally:
        scheduler.shutdown(timeout=60)
    return {
        "chunk": chunk,
        "tokens": n,
        "context": lm.context_length,
        "alone": [g for r in runs for g in r["alone"]],
        "window": [g for r in runs for g in r["window"]],
        "ttft": [r["ttft"] for r in runs],
        "outlasted": all(r["outlasted"] for r in runs),
    }


# ---------------------------------------------------------------------------------------------- 4
def measure_prefill(args, before: bool) -> dict:
    import torch

    from millm.engine import kernels

    lm = _load(Path(args.work), before=before)
    sizes = [int(s) for s in args.sizes.split(",")]
    top = min(max(sizes), lm.context_length - 1)
    ids = long_ids(lm.tokenizer, top, "prefill")
    if not before:  # the very ids llama.cpp evaluates
        (Path(args.work) / "prefill_ids.json").write_text(json.dumps(ids))
    rates = {}
    with torch.inference_mode():
        for size in sizes:
            prompt = ids[: min(size, top)]
            lm.runner.prefill([prompt], len(prompt) + 1)  # warm-up
            best = math.inf
            for _ in range(args.repeats):
                start = time.perf_counter()
                lm.runner.prefill([prompt], len(prompt) + 1)
                best = min(best, time.perf_counter() - start)
            rates[size] = len(prompt) / best
    return {
        "rates": rates,
        "kernels": lm.runner.kernels,
        "threads": torch.get_num_threads(),
        "dense_rows": kernels.DENSE_ROWS,
        "float32_copy_rows": kernels.FLOAT32_COPY_ROWS,
    }


LLAMA = """
import json, sys, time
from llama_cpp import Llama
path, ids_file, sizes = sys.argv[1], sys.argv[3], sys.argv[4]
threads, repeats, ubatch = int(sys.argv[2]), int(sys.argv[5]), int(sys.argv[6])
ids = json.load(open(ids_file))
sizes = [int(s) for s in sizes.split(",")]
n_ctx = min(max(sizes), len(ids)) + 16
llm = Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=ubatch, n_threads=threads,
            n_threads_batch=threads, verbose=False)
rates = {}
for size in sizes:
    prompt = ids[:size]
    best = float("inf")
    for i in range(repeats + 1):  # the first is a warm-up
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        if i:
            best = min(best, time.perf_counter() - start)
    rates[size] = len(prompt) / best
print(json.dumps({"rates": rates}))
"""


def measure_llama(args, threads: int) -> dict:
    from millm.engine.sources import demo_source

    source = demo_source()
    path = source.directory / source.gguf_file
    command = [
        sys.executable,
        "-c",
        LLAMA,
        str(path),
        str(threads),
        str(Path(args.work) / "prefill_ids.json"),
        args.sizes,
        str(args.repeats),
        str(LLAMA_UBATCH),
    ]
    result = json.loads(
        _check(subprocess.run(command, capture_output=True, text=True))
        .stdout.strip()
        .splitlines()[-1]
    )
    return {
        "rates": {int(k): v for k, v in result["rates"].items()},
        "file": path.name,
        "size": path.stat().st_size,
    }


# ----------------------------------------------------------------------------------------------
# driver
def one(args) -> None:
    section, variant = args.one
    if section == "1":
        result = measure_turns(args, variant == "on")
    elif section == "2":
        result = measure_webui(args)
    elif section == "3":
        result = measure_join(args, int(variant))
    else:
        result = measure_prefill(args, variant == "before")
    print(json.dumps(result))


def _check(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-6000:])
        raise SystemExit(
            f"a measurement failed (exit {done.returncode}): {' '.join(done.args[:6])} ..."
        )
    return done


def run(args, section: str, variant: str) -> dict:
    """One measurement in a process of its own; its JSON result."""
    command = [
        sys.executable,
        __file__,
        "--one",
        section,
        variant,
        "--work",
        args.work,
        "--repeats",
        str(args.repeats),
        "--cache-bytes",
        str(args.cache_bytes),
        "--history",
        str(args.history),
        "--answer",
        str(args.answer),
        "--system",
        str(args.system),
        "--long",
        str(args.long),
        "--alone",
        str(args.alone),
        "--sizes",
        args.sizes,
        "--threads",
        str(args.threads),
        "--engine",
        args.engine,
    ]
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    done = _check(subprocess.run(command, capture_output=True, text=True, env=environment))
    return json.loads(done.stdout.strip().splitlines()[-1])


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def median(values) -> float:
    return statistics.median(values)


def section1(args) -> None:
    off, on = run(args, "1", "off"), run(args, "1", "on")
    t_off, t_on = (
        median([r["turn2"] for r in off["runs"]]),
        median([r["turn2"] for r in on["runs"]]),
    )
    r = on["runs"][0]
    print(
        "\n### 1. Second chat turn over a long history (serial policy, median of "
        f"{len(on['runs'])} conversations)\n"
    )
    print(
        "| history (turn 1 prompt) | turn 2 prompt | turn 1 TTFT (cold) | turn 2 TTFT, cache off "
        "| turn 2 TTFT, cache on | cached tokens (on) | on / off | goal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ratio = t_on / t_off
    print(
        f"| {r['history']} tok | {r['prompt']} tok | "
        f"{ms(median([x['turn1'] for x in on['runs']]))} | {ms(t_off)} | {ms(t_on)} | "
        f"{median([x['cached'] for x in on['runs']]):.0f} | {ratio:.2f}× | ≤ 0.20× "
        f"{'✓' if ratio <= 0.2 else '✗'} |"
    )
    if on["cache"]:
        c = on["cache"]
        print(
            f"\nprefix cache after the run: {c['blocks']} blocks of {c['block_tokens']} tokens, "
            f"{c['bytes'] / 2**20:.1f} MiB of {c['budget_bytes'] / 2**20:.0f} MiB; "
            f"{c['hits']}/{c['lookups']} lookups hit, {c['tokens_reused']} tokens reused"
        )
    sys.stdout.flush()


def section2(args) -> None:
    got = run(args, "2", "on")["runs"]
    r = got[0]
    first, repeat, new = (median([x[k] for x in got]) for k in ("first", "repeat", "new"))
    print(
        "\n### 2. Open WebUI-shaped request: long system prompt + 5 tools + short user message "
        f"(median of {len(got)})\n"
    )
    print(
        "| system prompt | prompt (with tools) | first TTFT | repeat TTFT | cached | repeat / "
        "first | new user message TTFT | cached | new / first | goal (repeat) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratio = repeat / first
    print(
        f"| {r['system']} tok | {r['prompt']} tok | {ms(first)} | {ms(repeat)} | "
        f"{r['repeat_cached']} | {ratio:.2f}× | {ms(new)} | {r['new_cached']} | "
        f"{new / first:.2f}× | ≤ 0.20× {'✓' if ratio <= 0.2 else '✗'} |"
    )
    sys.stdout.flush()


def section3(args) -> None:
    chunks = [int(c) for c in args.chunks.split(",")]
    results = [run(args, "3", str(c)) for c in chunks]
    n, context = results[0]["tokens"], results[0]["context"]
    fitted = (
        ""
        if n == args.long
        else f" (the largest the model's {context}-token window allows; {args.long} asked)"
    )
    print(
        f"\n### 3. A running stream while a {n}-token prompt joins{fitted} (continuous batching "
        f"on; gaps pooled over {args.repeats} joins)\n"
    )
    print(
        "| PREFILL_CHUNK_TOKENS | stream gap alone (median) | gaps in window | p95 gap in window "
        f"| max gap in window | p95 / median | {n}-token TTFT | goal p95 ≤ 3× median |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        alone, window = median(result["alone"]), result["window"]
        high = p95(window)
        label = f"{result['chunk']}" + (" (off)" if result["chunk"] >= n else "")
        note = "" if result["outlasted"] else " (stream ended early)"
        print(
            f"| {label} | {ms(alone)} | {len(window)} | {ms(high)} | {ms(max(window))} | "
            f"{high / alone:.1f}× | {median(result['ttft']):.2f} s{note} | "
            f"{'✓' if high <= 3 * alone else '✗'} |"
        )
    sys.stdout.flush()


def section4(args) -> None:
    after, before = run(args, "4", "after"), run(args, "4", "before")
    llama = measure_llama(args, args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"\n### 4. Prefill tokens/s, one row, best of {args.repeats} ({after['threads']} threads; "
        f"millm kernels: {after['kernels']})\n"
    )
    print(
        f"| prompt | before (int4 kernel every pass) | after ({copy_label(after)}) | after / "
        f"before | llama-cpp-python ({llama['file']}, n_ubatch {LLAMA_UBATCH}) | after / "
        "llama.cpp | goal after ≥ 2× before (at 2,000) |"
    )
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        a, b, c = after["rates"][str(size)], before["rates"][str(size)], llama["rates"][size]
        goal = ("✓" if a >= 2 * b else "✗") if size == 2000 else ""
        print(
            f"| {size} tok | {b:.0f} | {a:.0f} | {a / b:.2f}× | {c:.0f} | {a / c:.2f}× | {goal} |"
        )
    sys.stdout.flush()


def machine(args) -> str:
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    versions = []
    for name in ("torch", "transformers", "llama_cpp_python"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{MODEL} (Q4_1 GGUF, dtype auto, engine {args.engine}), {cpu}, {os.cpu_count()} cores, "
        f"{args.threads} threads; {', '.join(versions)}; Python {platform.python_version()}; load "
        f"average {load:.2f} at start; prefix cache budget {args.cache_bytes / 2**20:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and one repeat: checks the script end to end",
    )
    parser.add_argument("--only", choices="1234", help="run one section")
    parser.add_argument(
        "--engine",
        choices=["transformers", "llama.cpp"],
        default="transformers",
        help="1-3: the engine the demo file runs on (4 measures the transformers engine's prefill)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="distinct prompts per figure of 1-3, timed runs per figure of 4 (default 3; 1 with "
        "--quick)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=None,
        help="1: tokens of the conversation before turn 2 (default 2000)",
    )
    parser.add_argument(
        "--answer", type=int, default=None, help="1, 2: greedy tokens per answer (default 48)"
    )
    parser.add_argument(
        "--system",
        type=int,
        default=None,
        help="2: tokens of the system prompt, before the tools (default 1500)",
    )
    parser.add_argument(
        "--long", type=int, default=None, help="3: tokens of the joining prompt (default 4000)"
    )
    parser.add_argument(
        "--alone",
        type=int,
        default=None,
        help="3: stream gaps timed before the long prompt joins (default 24)",
    )
    parser.add_argument(
        "--chunks",
        default=None,
        help="3: PREFILL_CHUNK_TOKENS values, comma-separated (default 64,128,256,512,100000)",
    )
    parser.add_argument(
        "--sizes", default=None, help="4: prompt lengths, comma-separated (default 500,2000,4000)"
    )
    parser.add_argument(
        "--cache-bytes",
        type=int,
        default=GIB,
        help="PREFIX_CACHE_BYTES where the cache is on (default 1 GiB)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="4: llama.cpp's threads (default: torch's thread count)",
    )
    parser.add_argument(
        "--work",
        default=None,
        help="where the dequantised checkpoint goes (default: a temporary folder)",
    )
    parser.add_argument("--one", nargs=2, metavar=("SECTION", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    pick = 1 if args.quick else 0
    for name, values in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, values[pick])
    if args.threads is None:
        import torch

        args.threads = torch.get_num_threads()
    if args.one:
        return one(args)
    args.work = args.work or tempfile.mkdtemp(prefix="millm-long-prompts-")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    print(
        "## Long "
        f"prompts{' (--quick: sizes too small to read figures from)' if args.quick else ''}\n"
    )
    print(machine(args))
    if hasattr(os, "getloadavg") and os.getloadavg()[0] > 0.5:
        print(
            f"\n**The machine is busy (load average {os.getloadavg()[0]:.1f}): other processes "
            "share the cores, and two OpenMP threads under contention slow down many times over; "
            "rerun when it is quiet.**"
        )
    sections = {"1": section1, "2": section2, "3": section3, "4": section4}
    for key, section in sections.items():
        if args.only in (None, key):
            section(args)


def copy_label(after: dict) -> str:
    """Which pre-packed copy the "after" run used, and from how many rows (its kernels line
    says)."""
    if "fp32 copy" in after["kernels"]:
        return f"float32 copy from {after.get('float32_copy_rows', 64)} rows"
    return f"bf16 copy from {after['dense_rows']} rows"


if __name__ == "__main__":
    main()
