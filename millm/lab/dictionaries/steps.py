"""A dictionary training's dealings with the scheduler and the store: its steps on the scheduler
thread (a full queue waited out), the reads that hand it activations (an SAE's point, or every
block's MLP input with the MLP's output beside it), where work that re-runs the MLPs reads from
(the served model, or a transformers copy beside one served on llama.cpp: trainings and grades of
transcoders), and how a training's end is stored."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from millm.engine.jobs import ResidualRead
from millm.engine.residual import mlp_input
from millm.errors import QueueFull
from millm.interp.attribution.replacement import ReplacementModel
from millm.interp.dictionary_training import DictionaryTrainer, last_checkpoint
from millm.kernel.model.beside import Beside
from millm.lab.discovery.reads import SKIPPED_POSITIONS
from millm.store.database import Store
from millm.store.dictionaries import end_training

TAG = "dictionary-training"
QUEUE_WAIT_S = 120.0  # how long a step waits out a full scheduler queue before the training fails


def take(trainer: DictionaryTrainer, acts: torch.Tensor, through: int | None, lm: object) -> list:
    """A CallJob's step: the trainer's buffer takes a group's activations; the batches ready."""
    return trainer.take(acts, through)


def step_block(trainer: DictionaryTrainer, batch: torch.Tensor, block: int, lm: object) -> dict:
    """A CallJob's step: one block's SAELens step on a batch (on the scheduler thread)."""
    return trainer.step_block(batch, block)


def waited_out(submit: Callable[[], Any]) -> Any:
    """`submit()`, a full scheduler queue waited out (up to QUEUE_WAIT_S) rather than ending a
    training of hours on a moment's burst of requests."""
    deadline = time.monotonic() + QUEUE_WAIT_S
    while True:
        try:
            return submit()
        except QueueFull:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def ended(
    store: Store,
    training_id: str,
    work_dir: Path,
    state: str,
    progress: dict,
    result: dict | None,
    error: dict | None,
) -> None:
    """Store how a training ended. Its checkpoint and activation cache go, but for a failed
    training that has a checkpoint: it may be resumed (POST .../resume); the folder it saved, if
    any, stays."""
    progress = {**progress, "resumable": state == "failed" and bool(last_checkpoint(work_dir))}
    end_training(store, training_id, state, progress, result, error)
    if not progress["resumable"]:
        shutil.rmtree(work_dir, ignore_errors=True)


def activations_read(point: int, block: int = 0) -> ResidualRead:
    """Every prompt position but the sink's, as float32 on the CPU (on the scheduler thread);
    tagged with the block it is for."""

    def rows(residuals: torch.Tensor) -> torch.Tensor:
        return residuals[SKIPPED_POSITIONS:].float().cpu()

    return ResidualRead(point, False, "prompt", f"{TAG}:{block}", encode=rows)


def mlp_read(model: ReplacementModel, block: int, device: torch.device) -> ResidualRead:
    """A transcoder's row `[x | y]` at every prompt position but the sink's: block `block`'s MLP
    input x as read, and y the block's MLP (its output norm included: what it adds to the
    residual) on it, in float32 on the model's `device`; the row on the CPU (on the scheduler
    thread)."""
    layout = model.layout.blocks[block]

    def rows(residuals: torch.Tensor) -> torch.Tensor:
        x = residuals[SKIPPED_POSITIONS:].float()
        y = model.mlp(layout, x.to(device))
        return torch.cat([x.cpu(), y.cpu()], dim=1)

    return ResidualRead(mlp_input(block), False, "prompt", f"{TAG}:{block}", encode=rows)


@contextmanager
def mlp_engine(switch, model: str, needed: bool) -> Iterator[str | Beside]:
    """Where work that re-runs the model's MLPs reads from: the served model by its name (or
    whenever `needed` is False), or, for a model served on llama.cpp (whose MLPs cannot be re-run
    from its graph), a transformers copy of its file held beside it until the block ends."""
    lm = switch.lm
    if not needed or lm is None or getattr(lm.runner, "layout", None) is not None:
        yield model
        return
    with switch.beside.loaded(switch.beside.plan_copy(lm)) as copy:
        yield copy


def training_reads(transcoders: int, point: int, lm) -> tuple[ResidualRead, ...]:
    """What each pass of a training reads: an SAE's point, or every one of `transcoders` blocks'
    MLP input and output (a CallJob's step: the replacement model's norms are checked against
    the served ones on the scheduler thread)."""
    if not transcoders:
        return (activations_read(point),)
    model = ReplacementModel(lm.runner.layout, frozen=False)
    return tuple(mlp_read(model, block, lm.device) for block in range(transcoders))


def packed_rows(reads) -> torch.Tensor:
    """The reads of one engine call as training rows: each row's blocks side by side (by the
    block in their tags), the rows one after another."""
    by_row: dict[int, dict[int, torch.Tensor]] = {}
    for read in reads:
        by_row.setdefault(read.row, {})[int(read.tag.rsplit(":", 1)[1])] = read.encoded
    return torch.cat(
        [
            torch.cat([blocks[b] for b in sorted(blocks)], dim=1)
            for _, blocks in sorted(by_row.items())
        ]
    )
