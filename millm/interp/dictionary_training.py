"""Training a sparse dictionary with SAELens 6: its architectures, its trainer, its file format.

millm supplies the activations (read from its own runner, so any family and engine it serves) and
SAELens does the rest: the architecture's training class and loss (`TopKTrainingSAE`,
`BatchTopKTrainingSAE`, `JumpReLUTrainingSAE`, `MatryoshkaBatchTopKTrainingSAE`), the optimiser,
learning-rate schedule, dead-latent bookkeeping and activation scaling (`SAETrainer`, driven step
by step through its public `step`, as SAELens's own multi-SAE trainer drives it), checkpoints
(`save_checkpoint` / `load_trainer_state`) and the inference file (`save_inference_model`: a
BatchTopK or Matryoshka SAE is written as the JumpReLU SAE it is at inference).

Why SAELens rather than EleutherAI's sparsify: sparsify's trainer runs the model itself through
transformers hooks, so it could not train on activations millm's runners read (llama.cpp's
included), and its files need a converter to be SAELens's; SAELens's trainer takes any iterator of
activation batches and writes the format millm, Neuronpedia and SAEBench read. SAELens 6 has no
transcoder trainer; interp/transcoder_training.py gives its training classes a transcoder's step.

A transcoder set trains one dictionary per block side by side on the same passes: a row holds
every block's `[x | y]` and each block's SAETrainer steps on its own slice of the same batch.

The activation buffer is the only thing that grows with the corpus, and it is bounded
(interp/activation_buffers.py).
Everything here is torch and runs on the scheduler thread (lab/dictionaries/training.py).
SAELens is imported where a training needs it, never at import: it brings TransformerLens, whose
import takes seconds that every server start would pay.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from millm.interp.activation_buffers import ShuffleBuffer
from millm.interp.dictionary_recipes import Recipe
from millm.interp.transcoder_training import (
    block_folder,
    save_transcoder,
    write_set_config,
)

if TYPE_CHECKING:
    from sae_lens.saes.sae import TrainingSAE
    from sae_lens.training.sae_trainer import SAETrainer

CHECKPOINT = "checkpoint"  # the folder under a training's work directory
STATE_FILE = "millm_state.json"  # millm's side of a checkpoint: tokens, corpus position, curve
BUFFER_FILE = "buffer.safetensors"  # the shuffling buffer's rows at the checkpoint
# What a block's trainer knows of its transcoder that the saved cfg.json keeps: its hooks, and
# SAELens's end-of-training figures (mean L0 and dead latents over its last sparsity window).
TRANSCODER_METADATA = ("hook_name", "hook_name_out", "l0", "num_dead_features")
CURVE_POINTS = 400  # most points a training curve keeps (halved by dropping every other one)


@dataclass
class Progress:
    """millm's side of a training (saved with each checkpoint): what has been done so far."""

    tokens: int = 0  # activation rows trained on
    steps: int = 0
    windows: int = 0  # corpus windows read (a resumed training starts after them)
    curve: list[dict] = field(default_factory=list)  # step, tokens, loss, mse, fve, l0, dead
    every: int = 1  # a curve point every this many steps (doubles as the curve is thinned)
    resumes: list[int] = field(default_factory=list)  # tokens trained at each resume
    rows_read: int = 0  # activations read from the model (and kept in the cache, with epochs)
    epoch: int = 1  # the pass over them now: 1 reads the model, later ones replay the cache
    replayed: int = 0  # rows of the cache fed in this epoch

    def record(self, point: dict) -> None:
        """Keep a point of the curve (at most CURVE_POINTS: past that, every other one goes)."""
        if self.steps % self.every:
            return
        self.curve.append(point)
        if len(self.curve) > CURVE_POINTS:
            self.curve = self.curve[::2]
            self.every *= 2


class DictionaryTrainer:
    """One SAELens training (or a transcoder set's, one per block): feed it activations, it trains
    whenever a batch is ready; checkpoint, resume and export it."""

    def __init__(self, recipe: Recipe, checkpoint: Path | None = None):
        from sae_lens.training.sae_trainer import SAETrainer

        torch.manual_seed(recipe.seed)
        self.recipe = recipe
        self.progress = Progress()
        self.trainers = []
        for block in range(recipe.blocks):
            sae = recipe.training_class()(recipe.sae_config(block))
            if checkpoint is not None:
                restore(sae, self._block_dir(checkpoint, block))
            trainer = SAETrainer(recipe.trainer_config(), sae, data_provider=iter(()))
            if checkpoint is not None:
                trainer.load_trainer_state(self._block_dir(checkpoint, block))
            self.trainers.append(trainer)
        if checkpoint is not None:
            self.progress = Progress(**json.loads((checkpoint / STATE_FILE).read_text()))
            self.progress.resumes.append(self.progress.tokens)
        generator = torch.Generator().manual_seed(recipe.seed + self.progress.windows)
        self.buffer = ShuffleBuffer(
            recipe.buffer_tokens, recipe.row_width, recipe.batch_tokens, generator
        )
        if checkpoint is not None:  # the rows read but not yet trained on, as they were
            self.buffer.put(load_file(str(checkpoint / BUFFER_FILE))["rows"])

    def _block_dir(self, folder: Path, block: int) -> Path:
        """Where a block's SAELens checkpoint lies: the folder itself for an SAE."""
        return folder / block_folder(block) if self.recipe.transcoders else folder

    @property
    def done(self) -> bool:
        """Whether every step has run."""
        return self.progress.steps >= self.recipe.steps

    @property
    def sae(self) -> TrainingSAE:
        """The SAE being trained (a set's first block)."""
        return self.trainers[0].sae

    def feed(self, activations: torch.Tensor, through: int | None) -> int:
        """Rows `[n, row_width]`, read from the model up to corpus window `through` (None:
        replayed from the cache); trains on every batch that is ready. Returns the steps run."""
        return self._train(self.take(activations, through))

    def take(self, activations: torch.Tensor, through: int | None) -> list[torch.Tensor]:
        """Put rows in the buffer (see feed); the batches ready to train on, to be trained with
        step_block and end_step (a job trains them one engine call at a time)."""
        if through is None:
            self.progress.replayed += len(activations)
        else:
            self.progress.windows = through
            self.progress.rows_read += len(activations)
        return self.buffer.put(activations.float())

    def finish(self) -> int:
        """The corpus ended: train on what the buffer still holds."""
        return self._train(self.buffer.drain())

    def _train(self, batches: list[torch.Tensor]) -> int:
        ran = 0
        for batch in batches:
            if self.done:
                break
            self.end_step(batch, [self.step_block(batch, b) for b in range(self.recipe.blocks)])
            ran += 1
        return ran

    def step_block(self, batch: torch.Tensor, block: int) -> dict:
        """One block's SAELens step on its slice of `batch`; its figures (end_step takes them)."""
        width = self.recipe.block_width
        trainer = self.trainers[block]
        rows = batch[:, block * width : (block + 1) * width]
        self._start(trainer, rows)
        output = trainer.step(rows)
        point = self._point(trainer, output)
        trainer.maybe_reset_sparsity()
        trainer.n_training_steps += 1
        return point

    def end_step(self, batch: torch.Tensor, points: list[dict]) -> None:
        """Every block has stepped on `batch`: count the step and keep its curve point."""
        self.progress.steps += 1
        self.progress.tokens += len(batch)
        self.progress.record(mean_point(self.progress, points))

    @torch.no_grad()
    def _start(self, trainer: SAETrainer, rows: torch.Tensor) -> None:
        """Before the first step: the activation scale, and the decoder bias at the activations'
        median (the TopK paper's b_pre): SAELens starts it at zero, and a residual stream's large
        shared offset then takes Adam thousands of steps to learn, which a short training does not
        have. A transcoder sets both sides' scales and its biases itself."""
        if self.progress.steps:
            return
        if self.recipe.transcoders:
            trainer.sae.start(rows)
            return
        scaler = trainer.activation_scaler
        scaler.estimate_scaling_factor(self.recipe.d_in, iter([rows]), 1)
        trainer.sae.b_dec.copy_(scaler(rows).median(0).values.to(trainer.sae.b_dec.dtype))

    @staticmethod
    def _point(trainer: SAETrainer, output) -> dict:
        """One block's figures of a step: loss, variance explained of its target and L0 of this
        batch, and the fraction of latents dead by SAELens's count."""
        with torch.no_grad():
            target = output.sae_in.float()
            residual = (output.sae_out.float() - target).pow(2).sum()
            total = (target - target.mean(0)).pow(2).sum()
            l0 = (output.feature_acts != 0).float().sum(-1).mean()
        return {
            "loss": float(output.loss.detach()),
            "fve": 1.0 - float(residual / total) if total > 0 else None,
            "l0": float(l0),
            "dead": float(trainer.dead_neurons.float().mean()),
        }

    def checkpoint(self, folder: Path) -> None:
        """Write the SAEs, SAELens's trainer states and millm's progress, replacing the last
        checkpoint only once the new one is whole."""
        staging = folder.with_name(folder.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        for block, trainer in enumerate(self.trainers):
            where = self._block_dir(staging, block)
            trainer.save_checkpoint(where.name, base_path=where.parent)
        rows = self.buffer.rows[: self.buffer.filled].contiguous()
        save_file({"rows": rows}, str(staging / BUFFER_FILE))
        (staging / STATE_FILE).write_text(json.dumps(asdict(self.progress)))
        old = folder.with_name(folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)

    def export(self, folder: Path, provenance: dict) -> None:
        """SAELens's inference files with `provenance` under each cfg's metadata, read from and
        written to raw activations (scales and decoder norms folded in): the SAE's folder, or a
        transcoder set's config.yaml and one SAELens transcoder folder per block."""
        folder.mkdir(parents=True, exist_ok=True)
        metadata = {
            "millm_provenance": provenance,
            "context_size": provenance.get("context_size"),
            "dataset_path": provenance.get("corpus", {}).get("name"),
            "model_name": self.recipe.model_name,
        }
        if self.recipe.transcoders:
            for block, trainer in enumerate(self.trainers):
                trainer.set_final_sae_metadata()
                config = trainer.sae.cfg.metadata
                own = {key: getattr(config, key, None) for key in TRANSCODER_METADATA}
                own = {key: value for key, value in own.items() if value is not None}
                save_transcoder(trainer.sae, folder / block_folder(block), {**metadata, **own})
            write_set_config(folder, self.recipe.model_name, self.recipe.blocks)
            return
        trainer = self.trainers[0]
        sae, scaler = trainer.sae, trainer.activation_scaler
        trainer.set_final_sae_metadata()
        if scaler.scaling_factor is not None:
            sae.fold_activation_norm_scaling_factor(scaler.scaling_factor)
            scaler.scaling_factor = None
        if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False) and self.recipe.architecture == (
            "topk"
        ):
            sae.fold_W_dec_norm()  # TopK's rescaling becomes plain weights (SAELens's own fold)
        for key, value in metadata.items():
            setattr(sae.cfg.metadata, key, value)
        sae.save_inference_model(folder)


def restore(sae: TrainingSAE, folder: Path) -> None:
    """A checkpoint's weights into `sae` (SAELens's own load steps; its load_from_disk would build
    the class registered for the architecture, not a transcoder's)."""
    from sae_lens.constants import SAE_WEIGHTS_FILENAME

    state = load_file(str(folder / SAE_WEIGHTS_FILENAME))
    sae.process_state_dict_for_loading(state)
    sae.load_state_dict(state)


def mean_point(progress: Progress, points: list[dict]) -> dict:
    """A curve point: the blocks' figures averaged (one block: its own), at this step."""
    point: dict[str, Any] = {"step": progress.steps, "tokens": progress.tokens}
    for key, digits in (("loss", 6), ("fve", 6), ("l0", 3), ("dead", 6)):
        values = [p[key] for p in points if p[key] is not None]
        point[key] = round(sum(values) / len(values), digits) if values else None
    return point


def exported_by(folder: Path) -> str | None:
    """The training id a saved dictionary's provenance names (a set: its first block's)."""
    for config in (folder / "cfg.json", folder / block_folder(0) / "cfg.json"):
        try:
            metadata = json.loads(config.read_text())["metadata"]
            return str(metadata["millm_provenance"]["training_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def last_checkpoint(work_dir: Path) -> Path | None:
    """The training's last whole checkpoint: the folder, or the one a crash between
    DictionaryTrainer.checkpoint's two renames left as `.old`; None before the first."""
    for folder in (work_dir / CHECKPOINT, work_dir / (CHECKPOINT + ".old")):
        if (folder / STATE_FILE).is_file():
            return folder
    return None


def default_checkpoints(training_tokens: int) -> int:
    """Tokens between checkpoints when the request names none: ten in a training."""
    return max(1, math.ceil(training_tokens / 10))
