"""Steps of longer model work run as engine jobs (CallJob): an attribution graph's passes.

Such work holds state between its steps (a forward pass whose autograd graph later backward
passes reuse); each step is a CallJob, so the scheduler serves other requests between them and
torch only ever runs on its thread. A step runs unsteered and unread: whatever steering it
wants it applies itself, and the editor is cleared again after it.
"""

from __future__ import annotations

from millm.engine.jobs import CallDone, CallJob
from millm.engine.loader import LoadedModel


def run_call(lm: LoadedModel, job: CallJob) -> None:
    """Run a CallJob's step; emits one CallDone."""
    lm.residual.clear()
    try:
        value = job.call(lm)
    finally:
        lm.residual.clear()
    job.emit(CallDone(value))
