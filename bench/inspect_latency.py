"""Latency of the discovery reads through a live demo server: inspect of a 200-token text, and a
contrast of 8 + 8 short texts.

One demo server (SmolLM2-135M-Instruct, the demo SAE attached at layer 12, 2048 features). The
text is cut to exactly --tokens tokens as the server counts them (through usage.prompt_tokens of
/v1/completions, before any inspect runs). Each read is timed from request to parsed answer:
the first run on the fresh server (first SAE encode, labels read from disk), then the median and
the range of --repeats more, interleaved with a scoring request of the same text(s) through
/v1/completions (the same forward passes without the SAE read: what the read itself adds is the
difference). Inspect asks for top_k 20 and feature 1403's per-token values.

    .venv/bin/python bench/inspect_latency.py [--tokens 200] [--repeats 5] [--base-url URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
SAE = "sae_262743630f92"
PARAGRAPH = (
    "The harbour town woke slowly. Fishing boats rocked against the pier while gulls argued over "
    "the morning catch, and the baker on the corner pulled the first loaves from a stone oven. "
    "Down by the water an old captain mended his nets, telling anyone who would listen about the "
    "storms he had sailed through, the islands he had seen and the treasure he never found. "
    "Children ran between the market stalls, where merchants sold olives, cheese, bright fabrics "
    "and maps of distant coasts. By noon the sun was high, the church bell rang twelve times, and "
    "the whole town stopped for lunch: bread, soup, grilled sardines and a glass of cold white "
    "wine. In the afternoon the wind turned, clouds gathered over the hills, and the fishermen "
    "hurried to bring their boats in before the rain."
)
PIRATE = [
    "Arr, the pirate ship sailed the seven seas.",
    "Ahoy matey, hoist the Jolly Roger!",
    "The captain buried his treasure on the island.",
    "Shiver me timbers, the crew wants rum.",
    "Walk the plank, ye scurvy dog!",
    "The pirates raided the merchant galleon at dawn.",
    "Yo ho ho, a pirate's life for me.",
    "The parrot squawked on the pirate's shoulder.",
]
NEUTRAL = [
    "The train leaves the station at nine.",
    "She bought apples and bread at the market.",
    "The meeting was moved to Thursday afternoon.",
    "He repaired the bicycle in the garage.",
    "The library opens early on weekdays.",
    "Rain is expected later this evening.",
    "They painted the kitchen a light blue.",
    "The report is due at the end of the month.",
]


def prompt_tokens(client: httpx.Client, text: str) -> int:
    """How many tokens the server encodes `text` into (one generated token, no inspect)."""
    response = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 1, "temperature": 0}
    )
    response.raise_for_status()
    return response.json()["usage"]["prompt_tokens"]


def text_of(client: httpx.Client, tokens: int) -> str:
    """A text of exactly `tokens` tokens (as the server counts them), cut from the paragraph
    repeated."""
    words = (PARAGRAPH + " ") * (tokens // 100 + 2)
    words_list = words.split()
    count, tried = tokens * 3 // 4, set()
    for _ in range(12):
        text = " ".join(words_list[:count])
        have = prompt_tokens(client, text)
        if have == tokens:
            return text
        tried.add(count)
        step = round(count * (tokens / have - 1)) or (1 if have < tokens else -1)
        count = count + step if count + step not in tried else count + (1 if have < tokens else -1)
    # A word may span two tokens, so exactly `tokens` may be out of reach: the closest text below
    # it.
    return " ".join(words_list[: count - 1])


def timed(client: httpx.Client, path: str, body: dict) -> tuple[float, dict]:
    """Seconds from request to parsed answer, and the answer."""
    start = time.perf_counter()
    response = client.post(path, json=body)
    answer = response.json()
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {answer}")
    return elapsed, answer


def score_body(prompt: str | list[str]) -> dict:
    """A scoring request: the same forward pass(es) with no SAE read (the baseline of a read)."""
    return {"model": MODEL, "prompt": prompt, "max_tokens": 1, "logprobs": 0, "temperature": 0}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--base-url", default=None, help="a running demo server (default: start one)"
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="data directory of the started server (default: a temporary one)",
    )
    args = parser.parse_args()

    server = None
    base_url = args.base_url
    if base_url is None:
        server = ServerProcess(
            args.home or Path(tempfile.mkdtemp(prefix="millm-bench-")), ["--log-level", "warning"]
        ).wait_ready(timeout=600)
        base_url = server.base_url
    inspect_path, contrast_path = f"/api/saes/{SAE}/inspect", f"/api/saes/{SAE}/contrast"
    try:
        with httpx.Client(base_url=base_url, timeout=600) as client:
            # also warms the model up: the first runs below are the reads' own
            text = text_of(client, args.tokens)
            reads = {
                "inspect": (inspect_path, {"text": text, "top_k": 20, "feature": 1403}),
                "scoring, same text": ("/v1/completions", score_body(text)),
                "contrast": (
                    contrast_path,
                    {"a": {"texts": PIRATE}, "b": {"texts": NEUTRAL}, "top_k": 20},
                ),
                "scoring, same 16 texts": ("/v1/completions", score_body(PIRATE + NEUTRAL)),
            }
            first = {name: timed(client, *reads[name]) for name in ("inspect", "contrast")}
            times: dict[str, list[float]] = {name: [] for name in reads}
            for _ in range(args.repeats):  # interleaved, so the machine's drift hits each alike
                for name, (path, body) in reads.items():
                    times[name].append(timed(client, path, body)[0])
    finally:
        if server is not None:
            server.stop()

    tokens = {
        "inspect": first["inspect"][1]["prompt_tokens"],
        "contrast": first["contrast"][1]["a"]["tokens"] + first["contrast"][1]["b"]["tokens"],
    }
    tokens["scoring, same text"], tokens["scoring, same 16 texts"] = (
        tokens["inspect"],
        tokens["contrast"],
    )
    print(
        f"\n{MODEL}, demo SAE {SAE} (layer 12, 2048 features); seconds from request to parsed "
        "answer"
    )
    print(
        "inspect: top_k 20 and feature 1403 per token; contrast: 8 pirate + 8 neutral short "
        "texts, top_k 20;"
    )
    print("scoring: /v1/completions with logprobs (the same forward passes, no SAE read)")
    print("| request | tokens | first run | median | range |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds in times.items():
        once = f"{first[name][0]:.3f}" if name in first else "–"
        print(
            f"| {name} | {tokens[name]} | {once} | {statistics.median(seconds):.3f} "
            f"({len(seconds)} runs) | {min(seconds):.3f}–{max(seconds):.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
