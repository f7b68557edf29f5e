"""The Monitor without a server: settings validated whole, a bounded work queue that drops and
counts past its bound (never waiting), and a worker that close() joins."""

import logging
import time

import pytest

from millm.engine.jobs import ResidualsRead
from millm.errors import InvalidRequest
from millm.interp.formats import read_sae
from millm.interp.steering import Attached
from millm.kernel.monitoring.monitor import Monitor
from millm.kernel.monitoring.requests import Origin
from millm.store.database import Store, database_url
from tests.support.tiny_saes import build_saelens

BACKLOG = 3


@pytest.fixture
def monitored(tmp_path):
    """An enabled monitor (queue bound BACKLOG) reading through a tiny SAE, and its hand-over
    callback."""
    info, sae = read_sae(build_saelens(tmp_path / "sae", layer=1, seed=5))
    attached = {info.id: Attached(info, sae, 1)}
    store = Store(database_url(tmp_path, None))
    monitor = Monitor(store, history=100, backlog=BACKLOG)
    monitor.configure({"enabled": True, "top_k": 2}, attached, lambda _: info)
    origin = Origin("cmpl-1", "tiny", [[1, 2, 3]], 1, lambda ids: " ".join(map(str, ids)))
    _, hand_over = monitor.read_for(attached, origin)
    yield monitor, hand_over, attached
    monitor.close()
    store.close()


def capture(row: int = 0) -> ResidualsRead:
    """A finished row's capture, encoded already (as the scheduler thread hands it over)."""
    return ResidualsRead(
        row, "monitoring", (7,), (42,), None, encoded=[[{"index": 3, "value": 1.5}]]
    )


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_settings_are_refused_by_location_and_change_nothing(monitored):
    monitor, _, attached = monitored
    before = monitor.describe(attached)
    for changes, param, needle in [
        ({"top_k": 65}, "top_k", "less than or equal to 64, got 65"),
        ({"positions": "middle"}, "positions", 'got "middle"'),
        ({"enabled": 1}, "enabled", "valid boolean"),
        ({"features": [1, -1]}, "features[1]", "greater than or equal to 0"),
        ({"colour": "blue"}, "colour", "unknown key"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            monitor.configure(changes, attached, lambda _: None)
        assert (
            info.value.param == param
            and info.value.message.startswith(f"{param}: ")
            and needle in info.value.message
        )
    assert monitor.describe(attached) == before


def test_past_its_bound_the_queue_drops_and_counts(monitored, caplog):
    monitor, hand_over, attached = monitored
    with monitor._lock:  # holding the monitor's lock stalls its worker, as a slow record would
        hand_over(capture())
        # the worker holds it
        wait_until(lambda: monitor.describe(attached)["queue"]["pending"] == 0)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="millm.kernel.monitoring.monitor"):
            for row in range(BACKLOG + 4):
                hand_over(capture(row))
        assert time.monotonic() - started < 1.0  # never waits for the stalled worker
        assert monitor.describe(attached)["queue"] == {
            "pending": BACKLOG,
            "max": BACKLOG,
            "dropped": 4,
        }
    monitor.flush()
    assert monitor.statistics()["requests"] == 1 + BACKLOG
    warnings = [r for r in caplog.records if "monitoring cannot keep up" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: one warning for four drops
    monitor.reset()
    assert monitor.describe(attached)["queue"]["dropped"] == 0


def test_close_records_what_is_queued_and_joins_the_worker(monitored):
    monitor, hand_over, _ = monitored
    assert monitor.worker.is_alive()
    for row in range(BACKLOG):
        hand_over(capture(row))
    monitor.close()
    assert not monitor.worker.is_alive()
    assert monitor.statistics()["requests"] == BACKLOG
