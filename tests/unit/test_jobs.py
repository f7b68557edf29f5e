"""The job book: progress, ETA, cancellation, the bound on running jobs, failures in the API's
shape."""

from __future__ import annotations

import threading
import time

import pytest

from millm.errors import InvalidRequest, NotFound, QueueFull
from millm.kernel.runtime.jobs import JobBook, JobState, JobWorkFailed


def wait_ended(book: JobBook, job_id: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = book.get(job_id)
        if view.state is not JobState.RUNNING:
            return view
        time.sleep(0.01)
    raise AssertionError(f"job {job_id} still running")


def test_a_job_reports_progress_and_eta_then_its_result():
    book = JobBook(max_running=2, kept=10, share=0.25, serving_busy=lambda: False)
    half, go = threading.Event(), threading.Event()

    def work(handle):
        handle.set_total(4)
        handle.advance(2)
        half.set()
        go.wait(5)
        handle.advance(2)
        return {"answer": 42}

    view = book.start("test", "a test job", 0, "texts", work)
    assert view.state is JobState.RUNNING
    half.wait(5)
    running = book.get(view.id)
    assert (running.progress.done, running.progress.total, running.progress.unit) == (2, 4, "texts")
    assert running.eta_s is not None and running.eta_s >= 0
    go.set()
    ended = wait_ended(book, view.id)
    assert (
        ended.state is JobState.SUCCEEDED and ended.result == {"answer": 42} and ended.eta_s is None
    )
    assert ended.finished_at is not None and ended.finished_at >= ended.started_at


def test_cancel_ends_a_job_as_cancelled_and_unknown_ids_are_404():
    book = JobBook(max_running=1, kept=10, share=0.25, serving_busy=lambda: False)

    def work(handle):
        while True:
            handle.check()
            time.sleep(0.01)

    view = book.start("test", "loops", 1, "steps", work)
    with pytest.raises(QueueFull, match="MILLM_MAX_JOBS"):
        book.start("test", "second", 1, "steps", work)
    book.cancel(view.id)
    assert wait_ended(book, view.id).state is JobState.CANCELLED
    with pytest.raises(NotFound) as caught:
        book.get("job_nope")
    assert caught.value.code == "job_not_found"


def test_a_failing_job_keeps_the_error_in_the_api_shape():
    book = JobBook(max_running=1, kept=10, share=0.25, serving_busy=lambda: False)

    def work(handle):
        raise InvalidRequest("texts[3] is empty", param="texts")

    view = book.start("test", "fails", 1, "texts", work)
    ended = wait_ended(book, view.id)
    assert ended.state is JobState.FAILED
    assert ended.error == {
        "message": "texts[3] is empty",
        "type": "invalid_request_error",
        "param": "texts",
        "code": "invalid_parameter",
    }


def test_a_running_job_shows_what_it_reported_and_a_job_that_did_nothing_fails_with_it():
    """A job's result while it runs is its first or last report; JobFailed ends it `failed` with
    its error and keeps the result that says why."""
    book = JobBook(max_running=1, kept=10, share=0.25, serving_busy=lambda: False)
    reported, go = threading.Event(), threading.Event()

    def work(handle):
        handle.report({"done": [], "skipped": [1]})
        reported.set()
        go.wait(5)
        raise JobWorkFailed("nothing done", code="nothing_done", result={"skipped": [1, 2]})

    view = book.start("test", "does nothing", 2, "items", work, result={"covers": [1, 2]})
    assert view.result == {"covers": [1, 2]}
    reported.wait(5)
    assert book.get(view.id).result == {"done": [], "skipped": [1]}
    go.set()
    ended = wait_ended(book, view.id)
    assert ended.state is JobState.FAILED and ended.result == {"skipped": [1, 2]}
    assert ended.error == {
        "message": "nothing done",
        "type": "server_error",
        "param": None,
        "code": "nothing_done",
    }


def test_pace_waits_three_times_the_work_at_a_quarter_share_only_while_serving():
    busy = {"now": True}
    book = JobBook(max_running=1, kept=10, share=0.25, serving_busy=lambda: busy["now"])
    waited: dict[str, float] = {}

    def work(handle):
        start = time.monotonic()
        handle.pace(0.1)
        waited["busy"] = time.monotonic() - start
        busy["now"] = False
        start = time.monotonic()
        handle.pace(0.1)
        waited["idle"] = time.monotonic() - start
        return {}

    wait_ended(book, book.start("test", "paces", 1, "steps", work).id)
    assert 0.29 <= waited["busy"] < 0.6
    assert waited["idle"] < 0.05


def test_only_the_last_kept_ended_jobs_are_remembered():
    book = JobBook(max_running=1, kept=3, share=0.25, serving_busy=lambda: False)
    ids = []
    for i in range(5):
        view = book.start("test", f"job {i}", 1, "steps", lambda handle: {})
        wait_ended(book, view.id)
        ids.append(view.id)
    assert [v.id for v in book.all()] == list(reversed(ids))[:3]


def test_autosteer_searches_labels_without_the_goals_instruction_words():
    from millm.lab.autosteer.inputs import search_words

    assert search_words("talk about Italian food") == "Italian food"
    assert search_words("Talk like a pirate!") == "pirate!"
    assert search_words("write about") == "write about"  # nothing else left: the goal itself
