"""Blocking torch work off the event loop, on a thread that ends when the work does.

PyTorch's OpenMP runtime keeps a pool of worker threads for every thread that ever ran a
parallel region, for as long as that thread lives. A thread-pool worker (or the event loop)
that once ran torch work keeps such an idle pool, and while it exists every decode step on the
scheduler thread ran 35% slower on this 2-core machine (measured: 60 -> 39 tok/s, back to 64
once the other thread exited). So torch work that is not a forward pass (loading a model or an
SAE, moving weights) runs on a fresh thread that exits afterwards, never on a pool thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable


async def in_passing_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on a new thread that ends with it; its result or exception comes back here."""
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
        loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name=f"millm-{getattr(fn, '__name__', 'work')}", daemon=True).start()
    return await future
