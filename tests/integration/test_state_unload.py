"""An unload frees a model only once its scheduler thread has stopped: a thread still inside the
model keeps it in memory (503 model_busy, nothing freed), and a later unload completes."""

from __future__ import annotations

import threading

import pytest

from millm.engine.jobs import GenerationJob
from millm.engine.sources import resolve_source
from millm.errors import ModelBusy
from millm.kernel.model import unloading
from millm.server.composition import build_state
from millm.settings import Settings
from tests.integration.engine_helpers import prompt_ids, row


@pytest.fixture
def state(tiny_dirs, tmp_path, monkeypatch):
    # how long this test waits for a stuck thread
    monkeypatch.setattr(unloading, "SCHEDULER_STOP_S", 0.3)
    settings = Settings.model_validate(
        {
            "MILLM_HOME": tmp_path / "home",
            "MILLM_DTYPE": "float32",
            "MILLM_DEVICE": "cpu",
            "GRACEFUL_UNLOAD_TIMEOUT": 0.2,
        }
    )
    server = build_state(settings, resolve_source(str(tiny_dirs["llama"]), tmp_path / "hub"))
    server.switch.load_in_background().join(120)
    yield server
    server.close()


def stuck_in_the_model(lm, gate: threading.Event, started: threading.Event):
    """A forward hook that holds the scheduler thread inside the model's forward pass until the
    gate opens."""

    def hold(module, inputs, output):
        if threading.current_thread().name.startswith("millm-scheduler"):
            started.set()
            gate.wait(30)

    return lm.model.model.layers[0].register_forward_hook(hold)


def test_a_stuck_scheduler_keeps_the_model_and_a_later_unload_frees_it(state):
    lm = state.switch.lm
    assert lm is not None
    gate, started = threading.Event(), threading.Event()
    hook = stuck_in_the_model(lm, gate, started)
    state.switch.scheduler.submit(
        GenerationJob(rows=[row(prompt_ids(lm, "The cat"), 5)], emit=lambda event: None)
    )
    assert started.wait(30)
    try:
        with pytest.raises(ModelBusy, match="did not stop within 0.3 s"):
            state.switch.unload(lm.name)
        # not freed under a running thread
        assert state.switch.lm is lm and state.switch.scheduler.thread_alive
    finally:
        gate.set()
        hook.remove()
    assert state.switch.unload(lm.name) is True
    assert state.switch.lm is None and state.switch.scheduler is None
    assert prompt_ids(lm, "still usable")  # the object itself was never torn down under the thread
