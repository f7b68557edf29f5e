"""in_passing_thread: a fresh thread per call that ends with it, at most MAX_PASSING_THREADS at
once; beating: a beat kept while the caller's thread is held up."""

import asyncio
import threading
import time

import pytest

from millm.errors import QueueFull
from millm.kernel.runtime.threads import MAX_PASSING_THREADS, beating, in_passing_thread


def held(gate: threading.Event, started: threading.Semaphore):
    """Work that blocks its thread until the gate opens, then names the thread it ran on."""
    started.release()
    assert gate.wait(30)
    return threading.current_thread()


async def until(condition, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_past_the_bound_a_call_is_refused_at_once_with_503_queue_full():
    async def scenario():
        gate, started = threading.Event(), threading.Semaphore(0)
        running = [
            asyncio.ensure_future(in_passing_thread(held, gate, started))
            for _ in range(MAX_PASSING_THREADS)
        ]
        for _ in range(MAX_PASSING_THREADS):
            await until(lambda: started.acquire(blocking=False))
        with pytest.raises(QueueFull) as refused:
            await in_passing_thread(held, gate, started)
        assert (refused.value.status, refused.value.code, refused.value.type) == (
            503,
            "queue_full",
            "server_error",
        )
        assert (
            f"{MAX_PASSING_THREADS} blocking operations" in refused.value.message
            and "held" in refused.value.message
        )
        gate.set()
        threads = await asyncio.gather(*running)
        assert len({t.ident for t in threads}) == MAX_PASSING_THREADS
        for thread in threads:  # each ran on its own thread, which ended with the work
            thread.join(5)
            assert not thread.is_alive()
        # Every slot came back: the bound is full again, not smaller.
        again = await asyncio.gather(
            *(in_passing_thread(lambda: 7) for _ in range(MAX_PASSING_THREADS))
        )
        assert again == [7] * MAX_PASSING_THREADS

    asyncio.run(scenario())


def test_an_exception_comes_back_and_frees_its_slot():
    def fails():
        raise ValueError("no such file")

    async def scenario():
        for _ in range(MAX_PASSING_THREADS + 2):  # more calls than slots, one after the other
            with pytest.raises(ValueError, match="no such file"):
                await in_passing_thread(fails)

    asyncio.run(scenario())


def test_a_cancelled_caller_keeps_its_slot_until_the_thread_ends():
    async def scenario():
        gate, started = threading.Event(), threading.Semaphore(0)
        first = asyncio.ensure_future(in_passing_thread(held, gate, started))
        await until(lambda: started.acquire(blocking=False))
        first.cancel()  # the client went away; the work cannot be stopped and still holds a thread
        others = [
            asyncio.ensure_future(in_passing_thread(held, gate, started))
            for _ in range(MAX_PASSING_THREADS - 1)
        ]
        for _ in others:
            await until(lambda: started.acquire(blocking=False))
        with pytest.raises(QueueFull):
            await in_passing_thread(lambda: 1)
        gate.set()
        await asyncio.gather(*others)
        await until(lambda: not any(t.name == "millm-held" for t in threading.enumerate()))
        assert await in_passing_thread(lambda: 2) == 2

    asyncio.run(scenario())


def test_a_held_thread_beats_from_another_until_its_block_ends():
    beats: list[tuple[float, str]] = []

    def beat() -> None:
        beats.append((time.monotonic(), threading.current_thread().name))
        if len(beats) == 2:
            raise OSError("the store is busy")  # a beat that fails is logged, the next one lands

    began = time.monotonic()
    with beating(0.05, beat, "train_x"):
        time.sleep(0.5)  # the caller's thread held up, as by a model's copy loading
    ended = time.monotonic()
    count = len(beats)
    time.sleep(0.2)
    assert len(beats) == count  # none after the block
    assert 3 <= count <= 10  # every 0.05 s of the 0.5 s (fewer on a busy machine)
    assert {name for _, name in beats} == {"millm-beat-train_x"}
    assert all(began < at <= ended for at, _ in beats)
    assert "millm-beat-train_x" not in [t.name for t in threading.enumerate()]
