"""SSE framing of engine events: deltas, finish chunks with usage, and a failure after the stream
started."""

import asyncio
import json

from millm.engine.jobs import JobFailed, RowFinished, RowSpec, TextDelta
from millm.engine.sampling import SamplingParams
from millm.errors import InsufficientMemory
from millm.v1.serving.answers import ChatShape, CompletionShape, Meta, chunks
from millm.v1.serving.generation import JobStream
from millm.v1.serving.http_replies import frames as sse_frames
from millm.v1.serving.protocol import CompletionRequest
from millm.v1.serving.replies import Admitted, Report

ROW = RowSpec(prompt_ids=(1, 2), sampling=SamplingParams(), max_tokens=4)


def frames(make_stream, events, rows=1):
    async def run():
        stream = JobStream([ROW] * rows)
        for event in events:
            stream.job.emit(event)
        return [frame async for frame in sse_frames(make_stream(stream))]

    raw = asyncio.run(run())
    assert all(f.startswith("data: ") and f.endswith("\n\n") for f in raw)
    return [f[6:-2] if f[6:-2] == "[DONE]" else json.loads(f[6:-2]) for f in raw]


META = Meta(id="chatcmpl-x", model="m", fingerprint="fp", created=1)


def admitted(prompt_tokens: int, include_usage: bool) -> Admitted:
    """A streamed request of `prompt_tokens` prompt tokens (chunks reads no model: none is loaded
    here)."""
    body = CompletionRequest.model_validate(
        {
            "model": "m",
            "prompt": "x",
            "stream": True,
            "stream_options": {"include_usage": include_usage},
        }
    )
    return Admitted(
        lm=None, body=body, prompts=[[0] * prompt_tokens], param="prompt", report=Report()
    )


def chat_chunks(stream, meta, prompt_tokens, rows, include_usage):
    return chunks(stream, rows, admitted(prompt_tokens, include_usage), ChatShape(), meta)


def completion_chunks(stream, meta, prompt_tokens, rows, include_usage):
    return chunks(stream, rows, admitted(prompt_tokens, include_usage), CompletionShape(), meta)


def test_failure_after_the_stream_started_is_an_error_event_then_done():
    error = InsufficientMemory("cpu ran out of memory during generation")
    out = frames(
        lambda s: chat_chunks(s, META, 2, 1, False), [TextDelta(0, "Hel"), JobFailed(error)]
    )
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert out[1]["choices"][0]["delta"] == {"content": "Hel"}
    # A 503-class failure says its wait in the event: no header can carry it once streaming.
    assert out[2] == {"error": {**error.to_dict(), "retry_after": 30}}
    assert out[2]["error"]["code"] == "insufficient_memory"
    assert out[3] == "[DONE]" and len(out) == 4


def test_last_finish_chunk_carries_usage():
    events = [
        TextDelta(0, "a"),
        TextDelta(1, "b"),
        RowFinished(1, "stop", 2),
        TextDelta(0, "c"),
        RowFinished(0, "length", 4),
    ]
    out = frames(lambda s: completion_chunks(s, META, 5, 2, False), events, rows=2)
    assert [c["choices"][0]["index"] for c in out[:-1]] == [0, 1, 1, 0, 0]
    assert "usage" not in out[2]
    assert out[4]["choices"][0]["finish_reason"] == "length"
    assert out[4]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 6,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert out[5] == "[DONE]"


def test_include_usage_moves_usage_to_a_chunk_without_choices():
    out = frames(
        lambda s: chat_chunks(s, META, 3, 1, True), [TextDelta(0, "x"), RowFinished(0, "stop", 1)]
    )
    assert "usage" not in out[2] and out[2]["choices"][0]["finish_reason"] == "stop"
    assert out[3]["choices"] == [] and out[3]["usage"]["total_tokens"] == 4
    assert out[4] == "[DONE]"
