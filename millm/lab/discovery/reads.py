"""Discovery reads: an SAE's activations over whole texts, summarised on the scheduler thread.

Inspect, contrast and calibration all run one forward pass per text and encode every position
but the first with an attached SAE. The first position is left out: in most models it is an
attention sink whose residual norm is tens of times the others' (about 25,000 against 150 in the
demo model's layer 12), and an SAE's activations there mean nothing. The dense `[positions,
features]` activations never leave the scheduler thread: each asker passes a `summarise`
function that turns them into what it keeps (numpy arrays or Python numbers), so no torch work
runs on the event loop or on a job's thread.

These passes are reads: unsteered unless the caller gives an edit, never monitored (the
monitor only sees generation rows), and never recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from millm.engine.jobs import ResidualRead, ScoresReady, ScoringJob
from millm.engine.residual import ResidualEdit
from millm.interp.sae import SAE
from millm.interp.sae_reads import ENCODE_CHUNK
from millm.interp.steering import Attached
from millm.lab.discovery.parts import DiscoveryParts
from millm.v1.serving.generation import answered

SKIPPED_POSITIONS = 1  # the attention sink at position 0
TAG = "discovery"


def encode_dense(sae: SAE, residuals: torch.Tensor) -> torch.Tensor:
    """Every feature's activation at every position `[n, d_sae]` (float32, CPU), encoded in
    chunks."""
    out = [
        sae.encode(residuals[start : start + ENCODE_CHUNK].to(sae.W_enc.device)).float().cpu()
        for start in range(0, residuals.shape[0], ENCODE_CHUNK)
    ]
    return torch.cat(out) if out else torch.zeros(0, sae.d_sae)


def discovery_read(
    attached: Attached, summarise: Callable[[torch.Tensor, tuple[int, ...]], Any]
) -> ResidualRead:
    """A read of every prompt position but the first at the SAE's point (after any edit there),
    whose dense activations `[n, d_sae]` and the positions they are at go to `summarise`, on the
    scheduler thread."""

    def encode(residuals: torch.Tensor) -> Any:
        with torch.inference_mode():
            acts = encode_dense(attached.sae, residuals[SKIPPED_POSITIONS:])
            positions = tuple(range(SKIPPED_POSITIONS, SKIPPED_POSITIONS + acts.shape[0]))
            return summarise(acts, positions)

    return ResidualRead(attached.read_point, True, "prompt", TAG, encode=encode)


async def read_passes(
    state: DiscoveryParts,
    prompts: list[list[int]],
    reads: tuple[ResidualRead, ...],
    edit: ResidualEdit | None = None,
) -> ScoresReady:
    """One pass per prompt on the scheduler thread for the request holding the model's lease; the
    reads' summaries come back in `ScoresReady.reads`."""
    return await answered(
        state.switch.submit,
        ScoresReady,
        lambda emit: ScoringJob(prompts=prompts, emit=emit, reads=reads, edit=edit),
    )
