"""What /v1/responses costs over /v1/chat/completions for the same answer. One run, one table.

The script starts a real `millm serve` on the demo model (no --model; or --model PATH) with its
own data directory, and sends --requests pairs of requests that ask for the same answer, one
after the other in alternating order (chat first in even pairs, responses first in odd ones, so
neither always finds the prefix cache warm from the other): a system instruction and a user
question of a few dozen tokens, greedy (temperature 0), --tokens output tokens, the same seed.
Each pair is checked to give the same text and token counts. Timed on the client with
time.perf_counter():

  - whole: from sending the request to the whole JSON body;
  - first text: streamed, from sending to the first text delta (chat's first `content` chunk;
    the Responses `response.output_text.delta` event);
  - stream end: streamed, from sending to the last frame ([DONE]; `response.completed` or
    `response.incomplete`, which is sent after the response is stored);
  - continue: a second turn. Chat sends the whole conversation again; Responses sends only the
    new message with previous_response_id (the stored conversation is read from the store).

Figures are p50 / p90 / max in milliseconds (statistics.quantiles, inclusive), and the
difference of the medians. What it measures is the translation, the event framing and the
store's write (and read, for continue), against chat's own path on the same server in the same
run.

    .venv/bin/python bench/responses_overhead.py [--requests 30] [--tokens 16] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402

SYSTEM = "You are a helpful assistant who answers in plain sentences."
QUESTION = "Tell me, in a few words, what a river does on its way from the mountains to the sea."
FOLLOW_UP = "And a glacier?"


def timed(client: httpx.Client, path: str, body: dict) -> tuple[float, dict]:
    began = time.perf_counter()
    response = client.post(path, json=body)
    response.raise_for_status()
    return (time.perf_counter() - began) * 1000, response.json()


def streamed(client: httpx.Client, path: str, body: dict) -> tuple[float, float, str]:
    """(ms to the first text delta, ms to the last frame, the text)."""
    began = time.perf_counter()
    first, text = None, ""
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            piece = (
                event.get("delta")
                if event.get("type") == "response.output_text.delta"
                else (
                    (event.get("choices") or [{}])[0].get("delta", {}).get("content")
                    if "choices" in event
                    else None
                )
            )
            if piece:
                first = first if first is not None else (time.perf_counter() - began) * 1000
                text += piece
    return first or float("nan"), (time.perf_counter() - began) * 1000, text


def summary(values: list[float]) -> str:
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return f"{statistics.median(values):.1f} / {cuts[8]:.1f} / {max(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument(
        "--model", type=Path, default=None, help="a model folder (default: the demo model)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as home:
        server = ServerProcess(
            Path(home), ["--model", str(args.model)] if args.model else [], allowed=[Path(home)]
        ).wait_ready()
        try:
            client = httpx.Client(base_url=server.base_url, timeout=300)
            model = client.get("/v1/models").json()["data"][0]["id"]
            chat = {
                "model": model,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": QUESTION},
                ],
                "max_tokens": args.tokens,
                "temperature": 0,
                "seed": 1,
            }
            resp = {
                "model": model,
                "instructions": SYSTEM,
                "input": QUESTION,
                "max_output_tokens": args.tokens,
                "temperature": 0,
                "seed": 1,
            }
            # warm-up: the first request pays for lazy set-up
            timed(client, "/v1/chat/completions", chat)
            timed(client, "/v1/responses", resp)
            rows: dict[str, dict[str, list[float]]] = {
                k: {"chat": [], "responses": []}
                for k in ("whole", "first text", "stream end", "continue")
            }
            for i in range(args.requests):
                order = ("chat", "responses") if i % 2 == 0 else ("responses", "chat")
                texts = {}
                for kind in order:
                    if kind == "chat":
                        ms, body = timed(client, "/v1/chat/completions", chat)
                        texts[kind] = (
                            body["choices"][0]["message"]["content"],
                            body["usage"]["prompt_tokens"],
                            body["usage"]["completion_tokens"],
                        )
                        first, end, streamed_text = streamed(client, "/v1/chat/completions", chat)
                        turn = {
                            **chat,
                            "messages": [
                                *chat["messages"],
                                {"role": "assistant", "content": texts[kind][0]},
                                {"role": "user", "content": FOLLOW_UP},
                            ],
                        }
                        more, _ = timed(client, "/v1/chat/completions", turn)
                    else:
                        ms, body = timed(client, "/v1/responses", resp)
                        texts[kind] = (
                            body["output"][0]["content"][0]["text"],
                            body["usage"]["input_tokens"],
                            body["usage"]["output_tokens"],
                        )
                        first, end, streamed_text = streamed(client, "/v1/responses", resp)
                        more, _ = timed(
                            client,
                            "/v1/responses",
                            {**resp, "input": FOLLOW_UP, "previous_response_id": body["id"]},
                        )
                    assert streamed_text == texts[kind][0], (kind, streamed_text, texts[kind][0])
                    for name, value in (
                        ("whole", ms),
                        ("first text", first),
                        ("stream end", end),
                        ("continue", more),
                    ):
                        rows[name][kind].append(value)
                assert texts["chat"] == texts["responses"], texts
        finally:
            server.stop()

    print(
        f"{platform.processor() or platform.machine()}, {args.requests} pairs, {args.tokens} "
        f"tokens, model {model}"
    )
    print("| request | chat p50 / p90 / max | responses p50 / p90 / max | p50 difference |")
    print("|---|---|---|---|")
    for name, kinds in rows.items():
        gap = statistics.median(kinds["responses"]) - statistics.median(kinds["chat"])
        print(f"| {name} | {summary(kinds['chat'])} | {summary(kinds['responses'])} | {gap:+.1f} |")


if __name__ == "__main__":
    main()
