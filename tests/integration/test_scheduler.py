"""The scheduler thread: bounded admission, failures contained, every admitted job answered, and a
finished job freed at once."""

import contextvars
import gc
import threading
import weakref

import pytest

from millm.engine.jobs import CallDone, CallJob, GenerationJob, JobFailed, RowFinished
from millm.engine.scheduler import Scheduler, background
from millm.errors import QueueFull, ServerShuttingDown
from tests.integration.engine_helpers import Outcome, prompt_ids, row


def gated_job(lm, gate: threading.Event, started: threading.Event):
    """A job whose first event blocks the scheduler until the test opens the gate."""
    outcome = Outcome()

    def emit(event):
        started.set()
        gate.wait(10)
        outcome.record(event)

    return GenerationJob(rows=[row(prompt_ids(lm, "The cat"), 5)], emit=emit), outcome


def finished_job(lm, prompt):
    outcome = Outcome()
    done = threading.Event()

    def emit(event):
        outcome.record(event)
        if isinstance(event, (RowFinished, JobFailed)):
            done.set()

    return GenerationJob(rows=[row(prompt, 5)], emit=emit), outcome, done


def test_admission_is_bounded_and_nothing_admitted_is_lost(llama_lm):
    scheduler = Scheduler(llama_lm, max_pending=2)
    gate, started = threading.Event(), threading.Event()
    try:
        running, running_outcome = gated_job(llama_lm, gate, started)
        scheduler.submit(running)
        assert started.wait(10)  # the scheduler is now inside the first job
        queued = [finished_job(llama_lm, prompt_ids(llama_lm, "A river")) for _ in range(2)]
        for job, _, _ in queued:
            scheduler.submit(job)
        assert (scheduler.queue_depth, scheduler.in_flight) == (2, 1)
        with pytest.raises(QueueFull) as info:
            scheduler.submit(finished_job(llama_lm, prompt_ids(llama_lm, "A river"))[0])
        assert info.value.status == 503 and info.value.code == "queue_full"
        # A batch's line waits apart: never refused, and behind every interactive job.
        line = finished_job(llama_lm, prompt_ids(llama_lm, "A river"))

        def as_background() -> None:
            background.set(True)
            scheduler.submit(line[0])

        contextvars.copy_context().run(as_background)
        assert (scheduler.queue_depth, scheduler.background_waiting) == (2, 1)
        gate.set()
        for _, outcome, done in [*queued, line]:
            assert done.wait(30)
            assert outcome.finish == {0: "length"} and outcome.tokens == {0: 5}
    finally:
        gate.set()
        scheduler.shutdown(timeout=30)
    assert running_outcome.finish == {0: "length"}


def test_a_failing_job_reports_and_the_next_one_is_served(llama_lm):
    scheduler = Scheduler(llama_lm, max_pending=4)
    try:
        bad, bad_outcome, bad_done = finished_job(llama_lm, [10**6])  # id far outside the embedding
        good, good_outcome, good_done = finished_job(llama_lm, prompt_ids(llama_lm, "Paris"))
        scheduler.submit(bad)
        scheduler.submit(good)
        assert bad_done.wait(30) and good_done.wait(30)
        assert bad_outcome.failed and bad_outcome.failed[0].code == "generation_failed"
        assert "IndexError" in bad_outcome.failed[0].message
        assert good_outcome.finish == {0: "length"}
    finally:
        scheduler.shutdown(timeout=30)


def test_shutdown_answers_queued_jobs(llama_lm):
    scheduler = Scheduler(llama_lm, max_pending=4)
    gate, started = threading.Event(), threading.Event()
    running, _ = gated_job(llama_lm, gate, started)
    scheduler.submit(running)
    assert started.wait(10)
    waiting, outcome, done = finished_job(llama_lm, prompt_ids(llama_lm, "Paris"))
    scheduler.submit(waiting)
    stopper = threading.Thread(target=scheduler.shutdown, kwargs={"timeout": 30})
    stopper.start()
    gate.set()
    stopper.join(30)
    assert done.wait(5)
    assert isinstance(outcome.failed[0], ServerShuttingDown)
    with pytest.raises(ServerShuttingDown):
        scheduler.submit(finished_job(llama_lm, [1])[0])


def test_cancelled_job_in_queue_is_skipped(llama_lm):
    scheduler = Scheduler(llama_lm, max_pending=4)
    gate, started = threading.Event(), threading.Event()
    try:
        running, _ = gated_job(llama_lm, gate, started)
        scheduler.submit(running)
        assert started.wait(10)
        skipped, skipped_outcome, _ = finished_job(llama_lm, prompt_ids(llama_lm, "Paris"))
        after, _, after_done = finished_job(llama_lm, prompt_ids(llama_lm, "Paris"))
        scheduler.submit(skipped)
        scheduler.submit(after)
        skipped.cancel()
        gate.set()
        assert after_done.wait(30)
        assert skipped_outcome.events == []
    finally:
        gate.set()
        scheduler.shutdown(timeout=30)


@pytest.mark.parametrize("batching", [False, True])
def test_shutdown_reports_that_the_thread_stopped(llama_lm, batching):
    scheduler = Scheduler(llama_lm, max_pending=4, batching=batching)
    assert scheduler.backend == ("batched" if batching else "serial")  # both loops end on shutdown
    job, outcome, done = finished_job(llama_lm, prompt_ids(llama_lm, "Paris"))
    scheduler.submit(job)
    assert done.wait(30) and outcome.finish == {0: "length"}
    assert scheduler.thread_alive
    assert scheduler.shutdown(timeout=30) is True
    assert not scheduler.thread_alive


def test_shutdown_of_a_stuck_thread_returns_false_and_logs_the_thread_and_where_it_is(
    llama_lm, caplog
):
    scheduler = Scheduler(llama_lm, max_pending=4)
    gate, started = threading.Event(), threading.Event()
    try:
        stuck, _ = gated_job(llama_lm, gate, started)  # its first event blocks the scheduler thread
        scheduler.submit(stuck)
        assert started.wait(10)
        with caplog.at_level("ERROR", logger="millm.engine.scheduler"):
            assert scheduler.shutdown(timeout=0.2) is False
        assert scheduler.thread_alive
        (record,) = [r for r in caplog.records if "did not stop" in r.getMessage()]
        message = record.getMessage()
        assert record.levelname == "ERROR"
        assert f"'millm-scheduler[{llama_lm.name}]'" in message and "within 0.2 s" in message
        assert "gate.wait(10)" in message  # the stuck thread's own stack: where it is blocked
    finally:
        gate.set()
    assert scheduler.shutdown(timeout=30) is True and not scheduler.thread_alive


def test_a_finished_job_and_what_it_holds_are_freed_without_the_cycle_collector(llama_lm):
    """A job is in no reference cycle (its guarded emit holds no reference back to it) and the
    scheduler keeps none once it ended, so what a finished job held (here a call's 64 MiB tensor)
    goes at once: with the cycle collector off, as it mostly is between its rare full passes."""
    import torch

    scheduler = Scheduler(llama_lm, max_pending=2)
    gc.collect()
    gc.disable()
    try:
        big = torch.zeros(16, 1 << 20)
        held = weakref.ref(big)
        done, values = threading.Event(), []

        def emit(event):
            values.append(event)
            done.set()

        job = CallJob(call=lambda lm, t=big: float(t.sum()), emit=emit)
        jobs = [weakref.ref(job)]
        del big
        scheduler.submit(job)
        assert done.wait(30)
        assert isinstance(values[0], CallDone) and values[0].value == 0.0
        failed_after = GenerationJob(rows=[row(prompt_ids(llama_lm, "The cat"), 1)], emit=emit)
        failed_after.fail(ServerShuttingDown("stopping"))  # a failed job emits once, then nothing
        failed_after.emit(values[0])
        assert [type(v) for v in values] == [CallDone, JobFailed]
        del job, failed_after
        pause = threading.Event()
        for _ in range(100):  # the scheduler lets go of its last reference just after the event
            if held() is None and all(ref() is None for ref in jobs):
                break
            pause.wait(0.05)
        assert held() is None and all(ref() is None for ref in jobs)
    finally:
        gc.enable()
        scheduler.shutdown()
