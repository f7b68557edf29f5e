"""A dictionary training as a job: activations read from the served model, trained on by SAELens,
checkpointed, saved with its provenance, registered, and then what the request asked for.

Where it runs. The job's thread never touches torch: each engine call (a group of windows, one
reads-only pass each, stopping after the read point) goes to the scheduler thread through
passes_blocking, and the training steps the new activations make ready go there too as a CallJob
(call_blocking), so serving and training take turns on the one thread that runs torch, and
JobHandle.pace keeps a chat stream's share while requests generate.

What survives. The SAELens checkpoint (weights, optimiser, schedules, dead-latent counts) and
millm's progress (tokens, steps, corpus windows read, the curves) and the shuffling buffer's rows
are written every `checkpoint_every_tokens`, the stored row's progress with them. A process that
dies leaves the row `running`; the next start resumes it from that checkpoint, reading the corpus
from the next window (or the activation cache from the next row). A server stopping
mid-training leaves it the same way; a cancel ends it.

Over 400 lines because a training is one story told in one class (read, train block by block,
checkpoint, save, register, then the chained jobs), each step a short method of it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from millm.engine.jobs import ResidualRead
from millm.errors import InvalidRequest, MillmError, describe
from millm.interp.activation_buffers import CACHE_FILE, ActivationCache
from millm.interp.dictionary_recipes import Recipe
from millm.interp.dictionary_training import (
    CHECKPOINT,
    DictionaryTrainer,
    exported_by,
    last_checkpoint,
)
from millm.kernel.model.beside import Beside
from millm.kernel.runtime.blocking import call_blocking, passes_blocking
from millm.kernel.runtime.jobs import JobCancelled, JobHandle, JobState, JobView
from millm.kernel.runtime.threads import beating
from millm.lab.calibration.protocol import CalibrateRequest
from millm.lab.dictionaries.corpus import CorpusWindow, OpenedCorpus
from millm.lab.dictionaries.parts import DictionaryParts
from millm.lab.dictionaries.protocol import GradeRequest, TrainRequest
from millm.lab.dictionaries.steps import (
    ended,
    mlp_engine,
    packed_rows,
    step_block,
    take,
    training_reads,
    waited_out,
)
from millm.lab.labels.protocol import ExplainRequest
from millm.store.dictionaries import beat


class TrainingHost(Protocol):
    """What a training needs of the service that started it: the kernel's parts, whether the
    server is stopping, to be forgotten when it ends, and the follow-up jobs it chains."""

    state: DictionaryParts
    stopping: bool

    def forget_run(self, training_id: str) -> None: ...

    def grade(self, sae_id: str, body: GradeRequest) -> JobView: ...

    def calibrate(self, sae_id: str, body: CalibrateRequest | None) -> JobView: ...

    def label(self, sae_id: str) -> dict: ...

    def explain(self, sae_id: str, body: ExplainRequest | None) -> JobView: ...


CALL_TOKENS = 2048  # tokens read per engine call (a request arriving waits for one call at most)
FOLLOW_POLL_S = 0.5  # how often the job looks at a follow-up job it waits for
EXPORT = "export"  # where the dictionary is written, in the work folder, before it takes its name
# How often a running training says it is alive (well inside the service's STALE_S, after which
# another replica starting up takes it for one whose process is gone).
HEARTBEAT_S = 20.0


def held_out_grade(body: TrainRequest) -> GradeRequest:
    """The grade a training asks for: its corpus's held-out windows."""
    return GradeRequest(corpus=body.corpus, part="held_out")


@dataclass
class DictionaryTrainingRun:
    """One training's work: call it with the job's handle."""

    service: TrainingHost
    training_id: str
    model: str
    body: TrainRequest
    recipe: Recipe
    corpus: OpenedCorpus
    point: int  # an SAE's read point (a transcoder set reads every block's MLP)
    work_dir: Path
    out_dir: Path
    checkpoint_every: int
    stage: str = "starting"
    trainer: DictionaryTrainer | None = None
    reads: tuple[ResidualRead, ...] = ()  # what each pass reads (made on the scheduler thread)
    engine: str | Beside = ""  # the served model's name, or the copy held beside it (_engine)
    follow_ups: dict[str, Any] = field(default_factory=dict)
    beaten: float = field(default_factory=time.monotonic)  # when the row last said it is alive
    # seconds in this process reading activations and training on them, and tokens read
    timing: dict[str, float] = field(default_factory=lambda: {"read_s": 0.0, "train_s": 0.0,
                                                               "tokens_read": 0})  # fmt: skip

    def __post_init__(self) -> None:
        self.engine = self.engine or self.model

    # the job --------------------------------------------------------------------------------------
    def __call__(self, handle: JobHandle) -> dict:
        try:
            result = self._run(handle)
            self._end("succeeded", result, None)
            return result
        except Exception as exc:
            if self.service.stopping:  # cut off (a cancel, or a call refused as the server stops):
                raise  # the row stays running, the work folder too: the next start resumes it
            if isinstance(exc, JobCancelled):
                self._end("cancelled", None, None)
            elif isinstance(exc, MillmError):
                self._end("failed", None, exc.to_dict())
            else:
                self._end("failed", None, {"message": describe(exc), "type": "server_error",
                                           "param": None, "code": "training_failed"})  # fmt: skip
            raise
        finally:
            self.service.forget_run(self.training_id)

    def _end(self, state: str, result: dict | None, error: dict | None) -> None:
        ended(self.service.state.store, self.training_id, self.work_dir, state, self.progress(),
              result, error)  # fmt: skip

    def _run(self, handle: JobHandle) -> dict:
        if not self._exported():
            with self._engine():
                self._train(handle)
            self.stage = "saving"
            self._export()
        return self._follow_up(handle)

    @contextmanager
    def _engine(self) -> Iterator[None]:
        """What the training reads from, for its length (steps.mlp_engine: a transcoder set of a
        model served on llama.cpp reads a transformers copy)."""
        self.stage = "loading"
        with ExitStack() as stack:
            # a copy's load beats from a thread of its own: a replica must not take the training
            with beating(HEARTBEAT_S, self._beat, self.training_id):
                self.engine = stack.enter_context(
                    mlp_engine(self.service.state.switch, self.model, bool(self.recipe.transcoders))
                )
            try:
                yield
            finally:  # the reads hold the copy's weights (its replacement model): let them go
                self.engine, self.reads = self.model, ()

    def _beat(self) -> None:
        """Say the training is alive, with its progress (for other replicas: see STALE_S)."""
        beat(self.service.state.store, self.training_id, self.progress())
        self.beaten = time.monotonic()

    def _train(self, handle: JobHandle) -> None:
        cancel = handle.cancel_event
        resume = last_checkpoint(self.work_dir)
        self.trainer = self._step(lambda lm: DictionaryTrainer(self.recipe, resume))
        self.reads = self._step(partial(training_reads, self.recipe.transcoders, self.point))
        handle.check()
        trainer = self.trainer
        assert trainer is not None
        handle.advance(trainer.progress.tokens)
        self.stage = "training"
        due = trainer.progress.tokens + self.checkpoint_every
        for acts, through in self._activations(cancel):
            if trainer.done:
                break
            self._train_on(handle, self._step(partial(take, trainer, acts, through)))
            if trainer.progress.tokens >= due:
                self._checkpoint()
                due = trainer.progress.tokens + self.checkpoint_every
            elif time.monotonic() - self.beaten > HEARTBEAT_S:  # alive, for other replicas
                self._beat()
            handle.check()
        handle.check()
        if not trainer.done:
            self._train_on(handle, self._step(lambda lm: trainer.buffer.drain()))
        if trainer.progress.steps == 0:
            raise InvalidRequest(
                f"the corpus gave fewer activations than one batch ({self.recipe.batch_tokens}); "
                "send more text or a smaller batch_tokens",
                param="corpus",
            )

    def _train_on(self, handle: JobHandle, batches: list[torch.Tensor]) -> None:
        """The batches the buffer gave, each block's step of each its own engine call: a request
        arriving waits for one block's step at most, never for a buffer's worth of them."""
        trainer = self.trainer
        assert trainer is not None
        for batch in batches:
            if trainer.done:
                return
            began = time.monotonic()
            points = [
                self._step(partial(step_block, trainer, batch, block))
                for block in range(self.recipe.blocks)
            ]
            trainer.end_step(batch, points)
            self.timing["train_s"] += time.monotonic() - began
            handle.advance(len(batch))
            handle.pace(time.monotonic() - began)

    def _activations(self, cancel) -> Iterator[tuple[torch.Tensor, int | None]]:
        """(rows, the corpus window they were read through) from the model for the first epoch,
        then (rows, None) replayed from the disk cache for the later ones."""
        trainer = self.trainer
        assert trainer is not None
        progress, recipe = trainer.progress, self.recipe
        cache = ActivationCache(self.work_dir / CACHE_FILE, recipe.row_width)
        if recipe.epochs > 1:
            cache.truncate(progress.rows_read)
        lm = self.service.state.switch.lm if isinstance(self.engine, str) else self.engine.lm
        if lm is None:
            raise InvalidRequest("the model was unloaded before the training began")
        if progress.epoch == 1:
            for group in self._groups(self._windows(lm.tokenizer, lm.context_length)):
                began = time.monotonic()
                acts = self._read(group, cancel)[: recipe.rows_per_epoch - progress.rows_read]
                self.timing["read_s"] += time.monotonic() - began
                self.timing["tokens_read"] += sum(len(window.ids) for window in group)
                if recipe.epochs > 1:
                    cache.append(acts)
                yield acts, group[-1].index + 1
                if trainer.done or progress.rows_read >= recipe.rows_per_epoch:
                    break
            progress.epoch = 2
        while recipe.epochs > 1 and progress.epoch <= recipe.epochs and not trainer.done:
            self.stage = f"epoch {progress.epoch} of {recipe.epochs}"
            for rows in cache.chunks(progress.replayed, CALL_TOKENS):
                yield rows, None
                if trainer.done:
                    return
            progress.epoch, progress.replayed = progress.epoch + 1, 0

    def _windows(self, tokenizer, context_length: int):
        """The training windows (not the held-out ones) after those a resumed training read."""
        start = self.trainer.progress.windows if self.trainer else 0
        for window in self.corpus.windows(tokenizer, context_length):
            if window.index >= start and not window.held_out:
                yield window

    @staticmethod
    def _groups(windows):
        """Windows in runs of about CALL_TOKENS tokens."""
        group: list[CorpusWindow] = []
        tokens = 0
        for window in windows:
            group.append(window)
            tokens += len(window.ids)
            if tokens >= CALL_TOKENS:
                yield group
                group, tokens = [], 0
        if group:
            yield group

    def _read(self, group: list[CorpusWindow], cancel) -> torch.Tensor:
        answered = waited_out(
            lambda: passes_blocking(
                self.service.state.switch,
                self.engine,
                [window.ids for window in group],
                self.reads,
                cancel=cancel,
                reads_only=True,
            )
        )
        if answered is None:
            raise JobCancelled()
        return packed_rows(answered.reads)

    def _step(self, call) -> Any:
        """`call(lm)` on the scheduler thread, run to its end: a cancel takes effect between steps
        (a step half done, a checkpoint or an export, must not be abandoned while it runs)."""
        return waited_out(lambda: call_blocking(self.service.state.switch, self.engine, call))

    def _checkpoint(self) -> None:
        trainer = self.trainer
        assert trainer is not None
        folder = self.work_dir / CHECKPOINT
        self._step(lambda lm: trainer.checkpoint(folder))
        self._beat()

    def _export(self) -> None:
        """The dictionary written into the work folder, then moved to its name in one rename."""
        trainer = self.trainer
        assert trainer is not None
        staged = self.work_dir / EXPORT
        shutil.rmtree(staged, ignore_errors=True)
        provenance = self.provenance()
        self._step(lambda lm: trainer.export(staged, provenance))
        staged.rename(self.out_dir)

    def _exported(self) -> bool:
        """Whether this training saved its dictionary already (a restart after the export: only
        the follow-ups are left)."""
        return exported_by(self.out_dir) == self.training_id

    def provenance(self) -> dict:
        """What made the dictionary: model, read point, corpus, tokens, library and settings."""
        from importlib.metadata import version

        trainer = self.trainer
        assert trainer is not None
        return {
            "trained_by": "millm",
            "training_id": self.training_id,
            "model": self.model,
            "kind": self.body.kind,
            "layer": self.body.layer,
            "hook_point": self.body.read_point,
            "corpus": self.corpus.describe(),
            "tokens": trainer.progress.tokens,
            "steps": trainer.progress.steps,
            "corpus_exhausted": trainer.progress.steps < self.recipe.steps,
            "resumed_at_tokens": list(trainer.progress.resumes),
            "library": {"sae_lens": version("sae-lens"), "torch": version("torch")},
            "activations_read": trainer.progress.rows_read,
            "hyperparameters": self.body.model_dump(
                mode="json", exclude={"corpus", "then", "name"}
            ),
            "final": trainer.progress.curve[-1] if trainer.progress.curve else None,
            "trained_at": time.time(),
        }

    # after the training ---------------------------------------------------------------------------
    def _follow_up(self, handle: JobHandle) -> dict:
        """Register the saved dictionary, then attach, grade, calibrate, label and explain it as
        asked, each follow-up job waited for in turn."""
        service, then = self.service, self.body.then
        self.stage = "registering"
        if self.recipe.transcoders:
            self.follow_ups = {"path": str(self.out_dir)}
            try:  # the set stands, saved, whether or not it can be registered now
                lm = service.state.switch.lm
                registered = service.state.transcoders.register(self.out_dir, lm)
                self.follow_ups["transcoder_set_id"] = registered.id
            except MillmError as exc:
                self.follow_ups["register_error"] = exc.to_dict()
            self.stage = "done"
            return dict(self.follow_ups)
        info, _ = service.state.registrations.sae(str(self.out_dir), None, None)
        result: dict[str, Any] = {"sae_id": info.id, "path": str(self.out_dir)}
        self.follow_ups = result
        if then.attach:
            self.stage = "attaching"
            try:
                result["attached_layer"] = service.state.switch.attach_sae(info.id, None).layer
            except MillmError as exc:  # the dictionary stands, saved and registered
                result["attach_error"] = exc.to_dict()
                self.stage = "done"
                return result
        steps = [
            ("grade", lambda: service.grade(info.id, held_out_grade(self.body))),
            ("calibration", lambda: service.calibrate(info.id, then.calibrate)),
            ("labels", lambda: service.label(info.id)),
            ("explain", lambda: service.explain(info.id, then.explain)),
        ]
        wanted = {"grade": then.grading, "calibration": then.calibrate is not None,
                  "labels": then.label, "explain": then.explain is not None}  # fmt: skip
        for name, start in steps:
            if wanted[name]:
                self.stage = name
                try:
                    begun = start()  # a job to wait for, or what a step done at once did
                    done = begun if isinstance(begun, dict) else self._wait_for(handle, begun)
                    result[name] = done
                except MillmError as exc:  # not started (queue_full, ...): the dictionary stands
                    result[name] = {"job_id": None, "state": "not_started", "error": exc.to_dict()}
                if result[name]["state"] != JobState.SUCCEEDED:
                    break  # explaining needs the calibration; the training itself stands
        self.stage = "done"
        return result

    def _wait_for(self, handle: JobHandle, view) -> dict:
        jobs = self.service.state.jobs
        while True:
            if handle.cancel_event.is_set():
                jobs.cancel(view.id)
            view = jobs.get(view.id)
            if view.state is not JobState.RUNNING:
                return {"job_id": view.id, "state": view.state.value, "error": view.error}
            if time.monotonic() - self.beaten > HEARTBEAT_S:
                self._beat()
            time.sleep(FOLLOW_POLL_S)

    # views ----------------------------------------------------------------------------------------
    def progress(self) -> dict:
        """Where it is: stage, tokens and steps of the total, windows read, the curves."""
        trainer = self.trainer
        done = trainer.progress if trainer is not None else None
        return {
            "stage": self.stage,
            "tokens": done.tokens if done else 0,
            "steps": done.steps if done else 0,
            "total_tokens": self.recipe.steps * self.recipe.batch_tokens,
            "total_steps": self.recipe.steps,
            "windows": done.windows if done else 0,
            "resumed_at_tokens": list(done.resumes) if done else [],
            "epoch": done.epoch if done else 1,
            "rows_read": done.rows_read if done else 0,
            "timing": {key: round(value, 3) for key, value in self.timing.items()},
            "curve": list(done.curve) if done else [],
            "follow_ups": dict(self.follow_ups),
        }
