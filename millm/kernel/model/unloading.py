"""Retiring the loaded model: close the slot, let running requests finish within the graceful
timeout, stop the scheduler, then free the weights (the switch holds the model change meanwhile)."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

import torch

from millm.engine.scheduler import Scheduler
from millm.errors import ModelBusy
from millm.kernel.model.slot import ModelSlot

log = logging.getLogger(__name__)

SCHEDULER_STOP_S = (
    30.0  # how long an unload waits for the scheduler thread to end after cancelling its jobs
)


def retire(slot: ModelSlot, name: str, timeout: float, before_free: Callable[[], None]) -> None:
    """Empty the slot of `name` (model_busy when its scheduler thread does not stop: the model then
    stays in memory, serving nothing); `before_free` runs once nothing can reach the model."""
    slot.close()
    deadline = time.monotonic() + timeout
    log.info("unloading %s: waiting up to %g s for running requests", name, timeout)
    finished = slot.drain(timeout)
    scheduler = slot.scheduler
    # Leases end with their HTTP exchange; a job whose client left may still be stopping.
    if finished and scheduler is not None:
        finished = scheduler.wait_idle(max(0.0, deadline - time.monotonic()))
    slot.stop_serving()
    if scheduler is not None:
        stop(scheduler, name, timeout)
    if not finished:
        log.warning(
            "unloading %s: requests still running after %g s were ended with model_busy",
            name,
            timeout,
        )
    before_free()
    lm, scheduler = slot.empty()
    cuda = lm is not None and lm.device.type == "cuda"
    del lm, scheduler
    collect(cuda)
    log.info("unloaded %s", name)


def collect(cuda: bool) -> None:
    """Free what nothing references any more: a model's weights once its last reference went
    (and CUDA's cached blocks, on a card)."""
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def stop(scheduler: Scheduler, name: str, timeout: float) -> None:
    """Stop the scheduler, ending what still runs with model_busy; refuse when its thread
    lingers."""
    cut = ModelBusy(
        f"model {name!r} was unloaded before this request finished "
        f"(GRACEFUL_UNLOAD_TIMEOUT is {timeout:g} s); retry",
        param="model",
    )
    if not scheduler.shutdown(timeout=SCHEDULER_STOP_S, error=cut):
        # Its thread may still be running the model: freeing it under that thread would crash
        # the process. The model stays in memory, serving nothing; a retried unload tries again.
        raise ModelBusy(
            f"model {name!r} could not be unloaded: its scheduler thread did not stop within "
            f"{SCHEDULER_STOP_S:g} s (the server log shows where it is); it stays in memory and "
            "serves nothing; retry the unload, or restart the server",
            param="model",
        )
