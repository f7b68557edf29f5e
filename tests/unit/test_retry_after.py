"""Every 503 says when to come back: each cause's Retry-After, a queue's measured wait, the wait
inside a stream, and the safety net for a 503 that forgot."""

import logging

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from millm.engine.waits import HoldTimes, retry_seconds
from millm.errors import (
    InsufficientMemory,
    InvalidRequest,
    ModelBusy,
    ModelNotLoaded,
    QueueFull,
    ServerShuttingDown,
    StoreUnavailable,
    table,
)
from millm.kernel.model.transitions import Transition, busy
from millm.server.retry_after import RetryAfterNet
from millm.v1.http.errors import error_body, error_response


@pytest.mark.parametrize(
    "error, seconds",
    [
        (ModelNotLoaded("no model"), "30"),
        (QueueFull("full"), "5"),
        (QueueFull("full", retry_after=42), "42"),
        (ModelBusy("busy"), "15"),
        (ServerShuttingDown("bye"), "10"),
        (StoreUnavailable("down"), "5"),
        (InsufficientMemory("oom"), "30"),
    ],
)
def test_each_503_names_its_wait(error, seconds):
    response = error_response(error)
    assert response.status_code == 503 and response.headers["retry-after"] == seconds
    assert "retry_after" not in error_body(error)["error"]  # the body keeps OpenAI's shape


def test_every_503_row_has_a_wait_and_nothing_else_has_one():
    for code, status, _, cls in table():
        assert (cls.retry_after is not None) == (status == 503), code
    assert "retry-after" not in error_response(InvalidRequest("bad")).headers


def test_a_model_change_is_waited_for_by_what_it_does():
    unloading = busy(Transition(unloading="a"))
    swapping = busy(Transition(loading="b", unloading="a"), param="sae_id")
    assert error_response(unloading).headers["retry-after"] == "5"
    assert error_response(swapping).headers["retry-after"] == "15"
    assert swapping.param == "sae_id" and "is being unloaded to load 'b'" in swapping.message


def test_a_stream_says_the_wait_in_its_error_event():
    assert error_body(QueueFull("full", retry_after=7), streamed=True)["error"]["retry_after"] == 7
    assert "retry_after" not in error_body(InvalidRequest("bad"), streamed=True)["error"]


def test_the_queue_wait_is_the_median_hold_times_the_jobs_ahead_per_runner():
    holds = HoldTimes()
    assert holds.estimate(queued=4, running=1) is None  # unmeasured is not 0
    for i, seconds in enumerate([2.0, 4.0, 9.0]):
        holds.began(i, at=100.0)
        holds.ended(i, served=True, at=100.0 + seconds)
    holds.began("cancelled", at=0.0)
    holds.ended("cancelled", served=False, at=500.0)  # not a measure of service
    assert holds.estimate(queued=4, running=1) == pytest.approx(4.0 * 5)
    assert holds.estimate(queued=4, running=2) == pytest.approx(4.0 * 6 / 2)
    assert [retry_seconds(x) for x in (None, 0.2, 2.1, 500.0)] == [None, 1, 3, 60]


def test_the_net_gives_a_bare_503_the_fallback_and_says_so(caplog):
    async def bare(request):
        return PlainTextResponse("down", status_code=503)

    async def timed(request):
        return PlainTextResponse("down", status_code=503, headers={"Retry-After": "7"})

    async def failed(request):
        return PlainTextResponse("no", status_code=500)

    app = Starlette(routes=[Route(p, f) for p, f in (("/b", bare), ("/t", timed), ("/f", failed))])
    client = TestClient(RetryAfterNet(app))
    with caplog.at_level(logging.WARNING, logger="millm.server.retry_after"):
        assert client.get("/b").headers["retry-after"] == "10"
    assert "retry_after_defaulted /b" in caplog.text
    assert client.get("/t").headers.get_list("retry-after") == ["7"]
    assert "retry-after" not in client.get("/f").headers
