"""Blocking torch work off the event loop, on a thread that ends when the work does; and a beat kept
while a thread is held up.

PyTorch's OpenMP runtime keeps a pool of worker threads for every thread that ever ran a parallel
region, for as long as that thread lives. A thread-pool worker (or the event loop) that once ran
torch work keeps such an idle pool, and while it exists every decode step on the scheduler thread
runs markedly slower (docs/engine.md has the measurement). So torch work that is not a forward pass
(loading a model or an SAE, moving weights) runs on a fresh thread that exits afterwards, never on a
pool thread.

Fresh threads are bounded: at most MAX_PASSING_THREADS run at once, and a call past that is
refused at once with 503 queue_full rather than starting another thread or waiting for one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from millm.errors import QueueFull

log = logging.getLogger(__name__)

# The work sent here is loads, unloads, SAE attaches and registrations (which may download):
# model changes refuse each other (model_busy), so a few threads cover every honest use, and a
# burst of clients cannot pile up blocked threads, each holding its stack and its arguments.
MAX_PASSING_THREADS = 8

# A threading semaphore, not an asyncio one: a slot is held by the thread, which may outlive the
# coroutine that started it (a client that disconnects cancels the await, not the work).
_slots = threading.BoundedSemaphore(MAX_PASSING_THREADS)


def _refusal(fn: Callable[..., Any]) -> QueueFull:
    # queue_full rather than a new code: the spec's 503 for "bounded admission, at its limit;
    # retry shortly", which SDKs already retry, and what a /v1 request that has to load a model
    # meets here is the same backpressure as the request queue.
    return QueueFull(
        f"the server is running {MAX_PASSING_THREADS} blocking operations (model loads, SAE "
        "attaches and registrations) already; retry once one finishes "
        f"({getattr(fn, '__name__', 'work')} was refused)"
    )


async def in_passing_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on a new thread that ends with it; its result or exception comes back
    here.

    Raises QueueFull (503) at once when MAX_PASSING_THREADS are running; never blocks the loop.
    """
    if not _slots.acquire(blocking=False):
        raise _refusal(fn)
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(outcome: tuple[bool, Any]) -> None:
        if future.done():
            return
        ok, value = outcome
        future.set_result(value) if ok else future.set_exception(value)

    def run() -> None:
        try:
            outcome = (True, fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, raised there
            outcome = (False, exc)
        finally:
            _slots.release()  # before the result is handed back: the caller may call again at once
        loop.call_soon_threadsafe(settle, outcome)

    try:
        threading.Thread(
            target=run, name=f"millm-{getattr(fn, '__name__', 'work')}", daemon=True
        ).start()
    except BaseException:
        # no thread started (RuntimeError: can't start new thread): nothing holds the slot
        _slots.release()
        raise
    return await future


@contextmanager
def beating(every_s: float, beat: Callable[[], None], name: str) -> Iterator[None]:
    """Call `beat` every `every_s` seconds from a thread of its own while the block runs: a
    liveness mark kept fresh while the caller's thread is held up in one long call (a model's copy
    loading), which could not beat itself. One thread per block, gone when it ends."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            try:
                beat()
            except Exception:  # a beat missed (the store busy) is logged; the next one may land
                log.exception("%s: a beat failed", name)

    thread = threading.Thread(target=run, name=f"millm-beat-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
