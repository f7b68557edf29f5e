"""The requests monitoring recorded: where each came from, and its prompt as the model read it.

A record names its request by the id its client got back (`chatcmpl-…`, `cmpl-…`, `resp_…`), so
a client finds the records of its own request, and the prompt's positions in a record can be
read against the prompt's text (GET /api/monitoring/requests/{id}). What is kept is bounded
twice: the requests of the last `max_requests` recorded (the history's size: every record it
holds finds its request), and `max_chars` characters of prompt text per request, each prompt's
start, in order, while characters are left (`truncated` and `chars` say what was cut). A batch
line's prompt is not kept: its batch's input file holds it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

from millm.errors import NotFound

PROMPT_CHARS = 16_384  # characters of a request's prompts kept (MONITORING_PROMPT_MAX_CHARS)


@dataclass(frozen=True)
class BatchLine:
    """A batch's line that a request serves."""

    batch_id: str
    line: int  # its line in the input file, from 1 (as the error file counts)
    custom_id: str


# Set by the batch runner around each line it serves (that line's task only).
batch_line: ContextVar[BatchLine | None] = ContextVar("batch_line", default=None)


@dataclass(frozen=True)
class Origin:
    """The request a monitored generation serves: the id its client got back, the model it named,
    its prompts' token ids, choices per prompt (rows are prompt-major), its tokenizer's decode
    (special tokens by name), and the batch line it serves, if any."""

    request_id: str
    model: str
    prompts: Sequence[Sequence[int]]
    choices: int
    decode: Callable[[list[int]], str]
    batch: BatchLine | None = None
    at: float = field(default_factory=time.time)


def prompts_kept(origin: Origin, max_chars: int) -> dict:
    """A request's prompts as the model read them (chat template applied, special tokens by name),
    `max_chars` characters in all: each prompt's start, in order, while characters are left."""
    left = max_chars
    prompts = []
    for index, ids in enumerate(origin.prompts):
        text = origin.decode(list(ids))
        kept = text[:left]
        left -= len(kept)
        prompts.append(
            {
                "index": index,
                "text": kept,
                "tokens": len(ids),
                "chars": len(text),
                "truncated": len(kept) < len(text),
            }
        )
    return {
        "object": "monitoring.request",
        "request_id": origin.request_id,
        "model": origin.model,
        "time": origin.at,
        "prompts": prompts,
    }


class RequestPrompts:
    """The prompts of the last `max_requests` requests recorded, most recently recorded last."""

    def __init__(self, max_requests: int, max_chars: int = PROMPT_CHARS):
        self.max_requests = max_requests
        self.max_chars = max_chars
        self._kept: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, origin: Origin) -> None:
        """A record of `origin` was made: keep its prompts (its first record decodes them), or
        mark them recently recorded, so they outlive older requests' prompts."""
        with self._lock:
            if origin.request_id in self._kept:
                self._kept.move_to_end(origin.request_id)
                return
        kept = prompts_kept(origin, self.max_chars)  # decoding: outside the lock
        with self._lock:
            self._kept[origin.request_id] = kept
            while len(self._kept) > self.max_requests:
                self._kept.popitem(last=False)

    def get(self, request_id: str) -> dict:
        """A kept request's prompts (404 when it is not kept)."""
        with self._lock:
            kept = self._kept.get(request_id)
        if kept is None:
            raise NotFound(
                f"no monitored request {request_id!r} is kept: prompts are kept for the last "
                f"{self.max_requests} requests recorded (MONITORING_HISTORY), until a reset",
                param="request_id",
                code="monitored_request_not_found",
            )
        return kept

    def clear(self) -> None:
        """Forget every kept prompt."""
        with self._lock:
            self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)
