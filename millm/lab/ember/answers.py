"""millm's chat answers in Ember's words: the SDK's ChatCompletion, its chunks (one choice each,
counted by `gf_token_index`), and the abort events that fired (`gf_event_names`, whose handler
in the SDK raises InferenceAbortedException)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from millm.errors import MillmError
from millm.lab.ember.protocol import (
    ChatAnswer,
    ChatChunk,
    ChatMessageOut,
    EmberChoice,
    EmberDelta,
    StreamChoice,
)
from millm.v1.objects import ChatCompletion, ChatCompletionChunk, WireModel


def fired_events(millm: dict | None, events: dict[str, str]) -> list[str] | None:
    """The SDK's event names of the abort probes that fired."""
    fired = [
        events[verdict["name"]]
        for verdict in (millm or {}).get("probes", [])
        if verdict.get("action") == "abort" and verdict.get("fired") and verdict["name"] in events
    ]
    return fired or None


def chat_answer(body: ChatCompletion, events: dict[str, str]) -> ChatAnswer:
    """A whole answer as the SDK reads it."""
    choice = body.choices[0]
    return ChatAnswer(
        id=body.id,
        created=body.created,
        model=body.model,
        system_fingerprint=body.system_fingerprint or "",
        gf_event_names=fired_events(body.millm, events),
        choices=[
            EmberChoice(
                message=ChatMessageOut(content=choice.message.content or ""),
                finish_reason=choice.finish_reason,
            )
        ],
    )


async def chat_chunks(
    chunks: AsyncIterator[WireModel | MillmError], events: dict[str, str]
) -> AsyncIterator[WireModel | MillmError]:
    """millm's chunks as Ember's: one choice each, counted; the verdicts' chunk as the abort events
    that fired; millm's last chunk (what steered it) left to the header."""
    count = 0
    try:
        async for chunk in chunks:
            if isinstance(chunk, MillmError):
                yield chunk
                return
            assert isinstance(chunk, ChatCompletionChunk)
            fired = fired_events(chunk.millm, events)
            if chunk.choices:
                choice = chunk.choices[0]
                text = choice.delta.content or ""
                if not text and choice.finish_reason is None:
                    continue
                delta, reason = EmberDelta(content=text), choice.finish_reason
            elif fired:
                delta, reason = EmberDelta(content=""), "content_filter"
            else:
                continue
            yield ChatChunk(
                id=chunk.id,
                created=chunk.created,
                model=chunk.model,
                system_fingerprint=chunk.system_fingerprint or "",
                gf_event_names=fired,
                choices=[StreamChoice(delta=delta, gf_token_index=count, finish_reason=reason)],
            )
            count += 1
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]  # an async generator: closing cancels the job
