"""Dictionary trainings and grades as the API presents them: start, follow, cancel, resume after a
restart; grade, read the cards (blocking; worker pool)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from functools import partial
from pathlib import Path

from millm.engine.families import supported
from millm.errors import Conflict, InvalidRequest, MillmError, ModelNotLoaded, NotFound
from millm.interp.dictionary_training import default_checkpoints
from millm.interp.steering import residual_point
from millm.kernel.books.transcoders import check_fit
from millm.kernel.runtime.jobs import JobState, JobView
from millm.lab.calibration.protocol import CalibrateRequest
from millm.lab.calibration.service import CalibrationManagement
from millm.lab.dictionaries.corpus import OpenedCorpus, open_corpus
from millm.lab.dictionaries.grading import GradeRun, kept_cards, shipped_grade, shipped_set_grade
from millm.lab.dictionaries.parts import DictionaryParts
from millm.lab.dictionaries.protocol import GradeRequest, TrainingView, TrainRequest
from millm.lab.dictionaries.recipes import recipe_of
from millm.lab.dictionaries.set_grading import SetGradeRun
from millm.lab.dictionaries.steps import ended
from millm.lab.dictionaries.training import DictionaryTrainingRun
from millm.lab.discovery.inputs import attached_sae
from millm.lab.labels.labelling import Labelling
from millm.lab.labels.protocol import ExplainRequest, TopTokenLabels
from millm.store.dictionaries import (
    RUNNING,
    delete_training,
    end_training,
    insert_training,
    reopen_training,
    take_orphan,
    training_row,
    training_rows,
)

log = logging.getLogger(__name__)
# A running training whose heartbeat is older belongs to a process that is gone (a live one beats
# every training.HEARTBEAT_S).
STALE_S = 90.0
RESUME_POLL_S = 30.0
MODEL_WAIT_S = 600.0  # how long a resumed training waits for its model to load
GRADE_LOGIT_BYTES = 1 << 30  # a grade's window: its three passes' logits at most this


def dictionaries_dir(home: Path) -> Path:
    """Where trained dictionaries are saved (each in a folder of its name)."""
    return home / "dictionaries"


class Dictionaries:
    """Trainings and grades."""

    def __init__(self, state: DictionaryParts):
        self.state = state
        self.lock = threading.Lock()
        self.runs: dict[str, tuple[DictionaryTrainingRun, str]] = {}  # training id -> (run, job id)
        self.stopping = False  # set as the server stops: a training cut off then resumes later

    def stop(self) -> None:
        """The server is stopping: the trainings it cuts off stay `running`, to resume at the next
        start."""
        self.stopping = True

    # training -------------------------------------------------------------------------------------
    def train(self, body: TrainRequest) -> TrainingView:
        """Check everything that can be checked before work starts (a 400 naming the field), then
        store the training and start its job."""
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded("no model is loaded to train a dictionary on; load one first")
        body = body.model_copy(update={"architecture": body.trained,
                                        "hook_point": body.hook_point or "resid_post"
                                        if body.kind == "sae" else None})  # fmt: skip
        recipe = recipe_of(body, lm, self.state.settings)
        # stored as resolved: a resume rebuilds the same buffer whatever the settings are then
        body = body.model_copy(update={"buffer_tokens": recipe.buffer_tokens})
        if recipe.transcoders and getattr(lm.runner, "layout", None) is None:
            # the copy a set of a model on llama.cpp reads: any refusal comes now
            self.state.switch.beside.plan_copy(lm)
        corpus = self._corpus(body.corpus)
        where = f"L{body.layer}" if body.kind == "sae" else "transcoders"
        name = body.name or f"{lm.name.replace('/', '_')}-{where}-{recipe.architecture}-" \
            f"{recipe.d_sae}"  # fmt: skip
        out_dir = dictionaries_dir(self.state.settings.home) / name
        training = [row for row in training_rows(self.state.store)
                    if row["state"] == RUNNING and row["request"].get("name") == name]  # fmt: skip
        if out_dir.exists() or training:
            where = f"training {training[0]['id']} is making it" if training else str(out_dir)
            raise Conflict(
                f"a dictionary named {name!r} exists already ({where}); choose another name",
                param="name",
                code="dictionary_exists",
            )
        training_id = f"train_{uuid.uuid4().hex[:12]}"
        work_dir = dictionaries_dir(self.state.settings.home) / ".work" / training_id
        work_dir.mkdir(parents=True)
        stored = {**body.model_dump(mode="json"), "name": name}
        insert_training(self.state.store, training_id, lm.name, stored, str(work_dir))
        run = self._run(training_id, lm.name, body.model_copy(update={"name": name}), recipe,
                        corpus, work_dir)  # fmt: skip
        return self._start(run)

    def _corpus(self, spec) -> OpenedCorpus:
        return open_corpus(spec, self.state.saes.get, self.state.registrations.paths.local)

    def _run_of(self, row: dict, lm) -> DictionaryTrainingRun:
        """A stored training's run again (to resume it), checked against the loaded model."""
        body = TrainRequest.model_validate(row["request"])
        return self._run(row["id"], row["model"], body, recipe_of(body, lm, self.state.settings),
                         self._corpus(body.corpus), Path(row["work_dir"]))  # fmt: skip

    def _run(self, training_id, model, body, recipe, corpus, work_dir) -> DictionaryTrainingRun:
        return DictionaryTrainingRun(
            service=self,
            training_id=training_id,
            model=model,
            body=body,
            recipe=recipe,
            corpus=corpus,
            point=residual_point(body.layer, body.hook_point) if body.kind == "sae" else -1,
            work_dir=work_dir,
            out_dir=dictionaries_dir(self.state.settings.home) / body.name,
            checkpoint_every=body.checkpoint_every_tokens
            or default_checkpoints(recipe.steps * recipe.batch_tokens),
        )

    def _start(self, run: DictionaryTrainingRun, fresh: bool = True) -> TrainingView:
        """Start the run's job; a fresh training whose job is refused (503 queue_full) is
        forgotten, as if it had never been asked for."""
        what = (
            f"SAE ({run.recipe.d_sae} latents) at layer {run.body.layer}"
            if not run.recipe.transcoders
            else f"transcoder per block ({run.recipe.d_sae} latents each)"
        )
        description = (
            f"train a {run.recipe.architecture} {what} of {run.model} on "
            f"{run.recipe.steps * run.recipe.batch_tokens} tokens"
        )
        try:
            with self.lock:
                view = self.state.jobs.start(
                    "dictionary-training", description, run.recipe.steps * run.recipe.batch_tokens,
                    "tokens", run,
                )  # fmt: skip
                self.runs[run.training_id] = (run, view.id)
        except MillmError:
            if fresh:
                delete_training(self.state.store, run.training_id)
                shutil.rmtree(run.work_dir, ignore_errors=True)
            raise
        return self.view(run.training_id)

    def forget_run(self, training_id: str) -> None:
        """The run's job ended (its row says how)."""
        with self.lock:
            self.runs.pop(training_id, None)

    def _row(self, training_id: str) -> dict:
        """A training's stored row; 404 training_not_found."""
        row = training_row(self.state.store, training_id)
        if row is None:
            raise NotFound(
                f"no dictionary training {training_id!r}", param="training_id",
                code="training_not_found",
            )  # fmt: skip
        return row

    def view(self, training_id: str) -> TrainingView:
        """One training, live while it runs here; 404 training_not_found."""
        return self._view(self._row(training_id))

    def _view(self, row: dict) -> TrainingView:
        with self.lock:
            live = self.runs.get(row["id"])
        progress, job_id = row["progress"], None
        if live is not None and row["state"] == RUNNING:
            progress, job_id = live[0].progress(), live[1]
        return TrainingView(
            id=row["id"], model=row["model"], state=row["state"], request=row["request"],
            progress=progress or {}, job_id=job_id, result=row["result"], error=row["error"],
            created_at=row["created_at"], finished_at=row["finished_at"],
        )  # fmt: skip

    def all(self) -> list[TrainingView]:
        """Every training, newest first."""
        return [self._view(row) for row in training_rows(self.state.store)]

    def cancel(self, training_id: str) -> TrainingView:
        """Stop a training running here (it ends `cancelled`); an ended one is returned as it
        is."""
        view = self.view(training_id)
        with self.lock:
            live = self.runs.get(training_id)
        if live is not None:
            self.state.jobs.cancel(live[1])
        elif view.state == RUNNING:
            raise Conflict(
                f"training {training_id} runs on another replica (or waits to resume); cancel it "
                "there",
                param="training_id",
                code="training_elsewhere",
            )
        return view

    def resume(self, training_id: str) -> TrainingView:
        """Resume a failed training from its last checkpoint, on the model it was training on
        (loaded again); 409 training_not_resumable otherwise."""
        row = self._row(training_id)
        lm = self.state.switch.lm
        if row["state"] != "failed" or not (row["progress"] or {}).get("resumable"):
            raise Conflict(
                f"training {training_id} is {row['state']}"
                + ("" if row["state"] != "failed" else " and kept no checkpoint")
                + "; only a failed training with a checkpoint resumes",
                param="training_id",
                code="training_not_resumable",
            )
        if lm is None or lm.name != row["model"]:
            raise Conflict(
                f"training {training_id} was on {row['model']!r}; load that model to resume it "
                f"(the server serves {lm.name if lm else 'no model'!r})",
                param="training_id",
                code="training_not_resumable",
            )
        run = self._run_of(row, lm)
        if not reopen_training(self.state.store, training_id):
            raise Conflict(
                f"training {training_id} is being resumed already", param="training_id",
                code="training_not_resumable",
            )  # fmt: skip
        try:
            return self._start(run, fresh=False)
        except MillmError as exc:
            end_training(self.state.store, training_id, "failed", row["progress"], None,
                         exc.to_dict())  # fmt: skip
            raise

    # resuming after a restart ---------------------------------------------------------------------
    def resume_interrupted(self) -> None:
        """Resume, in the background, the trainings a process that is gone left running."""
        if any(row["state"] == RUNNING for row in training_rows(self.state.store)):
            threading.Thread(
                target=self._resume_loop, name="millm-dictionary-resume", daemon=True
            ).start()

    def _resume_loop(self) -> None:
        shared = self.state.store.engine.dialect.name != "sqlite"  # SQLite: one process owns it
        while True:
            waiting = False
            for row in training_rows(self.state.store):
                with self.lock:
                    here = row["id"] in self.runs
                if row["state"] != RUNNING or here:
                    continue
                stale_before = time.time() - STALE_S if shared else time.time()
                if take_orphan(self.state.store, row["id"], stale_before):
                    self._resume(row)
                else:
                    waiting = True
            if not waiting:
                return
            time.sleep(RESUME_POLL_S)

    def _resume(self, row: dict) -> None:
        deadline = time.monotonic() + MODEL_WAIT_S
        while (lm := self.state.switch.lm) is None and time.monotonic() < deadline:
            time.sleep(1.0)
        try:
            if lm is None or lm.name != row["model"]:
                raise ModelNotLoaded(
                    f"training {row['id']} was on {row['model']!r}, and the server now serves "
                    f"{lm.name if lm else 'no model'!r}; it cannot resume"
                )
            self._start(self._run_of(row, lm), fresh=False)
            log.info("resumed dictionary training %s", row["id"])
        except Exception as exc:  # the row says why (POST .../resume may go on); the server goes on
            error = exc.to_dict() if hasattr(exc, "to_dict") else {"message": str(exc)}
            ended(self.state.store, row["id"], Path(row["work_dir"]), "failed",
                  row["progress"] or {}, None, error)  # fmt: skip

    # grading and the follow-ups -------------------------------------------------------------------
    def grade(self, sae_id: str, body: GradeRequest) -> JobView:
        """Check, then start grading the attached SAE on the corpus (a job)."""
        info = self.state.saes.get(sae_id)
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded("no model is loaded to grade the dictionary on; load one first")
        with self.state.steering.lock:
            attached = attached_sae(self.state, info, lm)
        if attached.transcoder:
            self._gradable_transcoder(attached, lm)
        self._check_window(body, lm)
        run = GradeRun(self.state, attached, lm.name, self._corpus(body.corpus), body)
        description = f"grade {sae_id} on {lm.name} ({body.max_tokens} tokens at most)"
        return self.state.jobs.start("dictionary-grade", description, body.max_tokens, "tokens",
                                     run)  # fmt: skip

    def grade_set(self, set_id: str, body: GradeRequest) -> JobView:
        """Check, then start grading a registered transcoder set on the corpus (a job)."""
        found = self.state.transcoders.get(set_id).transcoders
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded("no model is loaded to grade the set on; load one first")
        if found.kind != "transcoder_set":
            raise InvalidRequest(
                f"{set_id} is a cross-layer transcoder: its blocks write into every later block's "
                "MLP output; a grade replaces each block's MLP by its own transcoder",
                param="set_id",
                code="not_gradable",
            )
        check_fit(found, lm, "set_id")
        self._mlp_grade_possible(lm, set_id, "set_id")
        self._check_window(body, lm)
        run = SetGradeRun(self.state, set_id, found, lm.name, self._corpus(body.corpus), body)
        description = (
            f"grade transcoder set {set_id} on {lm.name} ({body.max_tokens} tokens at most)"
        )
        return self.state.jobs.start("dictionary-grade", description, body.max_tokens, "tokens",
                                     run)  # fmt: skip

    def set_grades(self, set_id: str) -> list[dict]:
        """A transcoder set's grade cards, newest first, the one its folder ships among them."""
        registered = self.state.transcoders.get(set_id)
        return kept_cards(self.state.store, set_id, partial(shipped_set_grade, registered))

    @staticmethod
    def _check_window(body: GradeRequest, lm) -> None:
        """A window's three passes keep their logits within GRADE_LOGIT_BYTES (a 400 naming the
        largest context_size that fits)."""
        window = min(body.corpus.context_size, lm.context_length)
        logits = 3 * window * lm.vocab_size * 4  # a window's three passes' logits, float32
        if logits > GRADE_LOGIT_BYTES:
            fits = GRADE_LOGIT_BYTES // (3 * lm.vocab_size * 4)
            raise InvalidRequest(
                f"corpus.context_size: windows of {window} tokens over a vocabulary of "
                f"{lm.vocab_size} make {logits / 2**30:.1f} GiB of logits per window; grade with "
                f"context_size {fits} or less",
                param="corpus.context_size",
            )

    def _mlp_grade_possible(self, lm, what: str, param: str) -> None:
        """A transcoder is graded on MLPs re-run from the lean runner's layout: a 400 for a family
        it does not run; on llama.cpp, the copy it is graded on is planned now (a 503 when it does
        not fit)."""
        if not supported(lm.config):
            raise InvalidRequest(
                f"{what} is graded on the model's MLPs re-run from the lean runner's layout; "
                f"{lm.name} ({lm.config.model_type}) runs on transformers' own forward",
                param=param,
                code="not_gradable",
            )
        if getattr(lm.runner, "layout", None) is None:
            self.state.switch.beside.plan_copy(lm)

    def _gradable_transcoder(self, attached, lm) -> None:
        """A transcoder is graded on its block's MLP: a 400 for a cross-layer transcoder's block
        (it writes into every later block), and _mlp_grade_possible's checks."""
        if attached.reach > 1:
            raise InvalidRequest(
                f"{attached.info.id} is a cross-layer transcoder's block: it writes into every "
                "later block's MLP output, and a grade replaces one block's MLP",
                param="sae_id",
                code="not_gradable",
            )
        self._mlp_grade_possible(lm, attached.info.id, "sae_id")

    def grades(self, sae_id: str) -> list[dict]:
        """An SAE's grade cards, newest first, the one its folder ships among them."""
        info = self.state.saes.get(sae_id)
        return kept_cards(self.state.store, sae_id, lambda kept: shipped_grade(info))

    def calibrate(self, sae_id: str, body: CalibrateRequest | None) -> JobView:
        """The calibration job a training chains."""
        assert body is not None
        return CalibrationManagement(self.state).start(sae_id, body)

    def label(self, sae_id: str) -> dict:
        """The labels by top tokens a training gives its features (what they did, as a state)."""
        done = Labelling(self.state).label_top_tokens(sae_id, TopTokenLabels())
        return {"state": JobState.SUCCEEDED.value, **done.model_dump()}

    def explain(self, sae_id: str, body: ExplainRequest | None) -> JobView:
        """The explaining job a training chains."""
        assert body is not None
        return Labelling(self.state).explain(sae_id, body)
