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
transcoder trainer, so transcoders are not trained here yet.

The activation buffer is the only thing that grows with the corpus, and it is bounded: a
`ShuffleBuffer` of `buffer_tokens` rows (SAELens's mixing-buffer scheme: once full, it is shuffled
and its first half given out as batches, the other half kept to mix with what comes next).
Everything here is torch and runs on the scheduler thread (lab/dictionaries/training.py).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
from sae_lens.saes.matryoshka_batchtopk_sae import (
    MatryoshkaBatchTopKTrainingSAE,
    MatryoshkaBatchTopKTrainingSAEConfig,
)
from sae_lens.saes.sae import TrainingSAE
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer
from safetensors.torch import load_file, save_file

Architecture = Literal["topk", "batchtopk", "jumprelu", "matryoshka_batchtopk"]
ARCHITECTURES: dict[str, tuple[type[TrainingSAE], type]] = {
    "topk": (TopKTrainingSAE, TopKTrainingSAEConfig),
    "batchtopk": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig),
    "jumprelu": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig),
    "matryoshka_batchtopk": (MatryoshkaBatchTopKTrainingSAE, MatryoshkaBatchTopKTrainingSAEConfig),
}
WITH_K = ("topk", "batchtopk", "matryoshka_batchtopk")
CHECKPOINT = "checkpoint"  # the folder under a training's work directory
CACHE_FILE = "activations.f32"  # the first epoch's activations, when there are more epochs
STATE_FILE = "millm_state.json"  # millm's side of a checkpoint: tokens, corpus position, curve
BUFFER_FILE = "buffer.safetensors"  # the shuffling buffer's rows at the checkpoint
CURVE_POINTS = 400  # most points a training curve keeps (halved by dropping every other one)


@dataclass(frozen=True)
class Recipe:
    """What to train: the architecture and its hyperparameters, where it reads, for how long."""

    architecture: Architecture
    d_in: int
    d_sae: int
    hook_name: str  # SAELens's name of the read point (blocks.L.hook_resid_post)
    model_name: str
    training_tokens: int
    batch_tokens: int = 4096
    buffer_tokens: int = 65536
    lr: float = 1e-3
    k: int | None = 32
    matryoshka_widths: tuple[int, ...] | None = None
    l0_coefficient: float = 1.0
    dead_window_tokens: int = 1_000_000  # a latent unfired this long is dead (aux loss revives it)
    seed: int = 0
    epochs: int = 1  # passes over the activations read (the later ones from the disk cache)

    @property
    def steps(self) -> int:
        """Training steps in all."""
        return max(1, self.training_tokens // self.batch_tokens)

    @property
    def rows_per_epoch(self) -> int:
        """Activations read from the model (each then trained on `epochs` times)."""
        return math.ceil(self.steps * self.batch_tokens / self.epochs)

    def sae_config(self):
        """The SAELens training config of this recipe."""
        _, config_class = ARCHITECTURES[self.architecture]
        options: dict[str, Any] = {
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "normalize_activations": "expected_average_only_in",
        }
        if self.architecture in WITH_K:
            options["k"] = self.k
        if self.architecture == "matryoshka_batchtopk":
            options["matryoshka_widths"] = list(self.matryoshka_widths or (self.d_sae,))
        if self.architecture == "jumprelu":
            options["l0_coefficient"] = self.l0_coefficient
        config = config_class(**options)
        config.metadata.hook_name = self.hook_name
        config.metadata.model_name = self.model_name
        return config

    def trainer_config(self) -> SAETrainerConfig:
        """SAELens's trainer config: Adam at `lr`, its last 20 % decayed linearly to nothing."""
        steps = self.steps
        return SAETrainerConfig(
            total_training_samples=steps * self.batch_tokens,
            train_batch_size_samples=self.batch_tokens,
            lr=self.lr,
            lr_end=0.0,
            lr_scheduler_name="constant",
            lr_decay_steps=steps // 5,
            dead_feature_window=max(1, self.dead_window_tokens // self.batch_tokens),
            feature_sampling_window=max(1, min(2000, steps)),
        )


class ShuffleBuffer:
    """A bounded store of activation rows, given out in shuffled batches (see the module's
    docstring); it never holds more than `capacity` rows."""

    def __init__(self, capacity: int, d_in: int, batch: int, generator: torch.Generator):
        if capacity < 2 * batch:
            raise ValueError(f"a buffer of {capacity} rows cannot mix batches of {batch}")
        self.rows = torch.empty(capacity, d_in)
        self.filled, self.batch, self.generator = 0, batch, generator

    def put(self, activations: torch.Tensor) -> list[torch.Tensor]:
        """Add rows; the batches ready to train on (each time the buffer fills)."""
        out: list[torch.Tensor] = []
        start = 0
        while start < len(activations):
            room = len(self.rows) - self.filled
            piece = activations[start : start + room]
            self.rows[self.filled : self.filled + len(piece)] = piece
            self.filled += len(piece)
            start += len(piece)
            if self.filled == len(self.rows):
                out += self._give(len(self.rows) // 2 // self.batch * self.batch)
        return out

    def drain(self) -> list[torch.Tensor]:
        """The whole batches left, shuffled (the end of the corpus); the rest is dropped."""
        return self._give(self.filled // self.batch * self.batch)

    def _give(self, count: int) -> list[torch.Tensor]:
        if count == 0:
            return []
        order = torch.randperm(self.filled, generator=self.generator)
        self.rows[: self.filled] = self.rows[order]
        given = self.rows[:count].clone()
        kept = self.filled - count
        self.rows[:kept] = self.rows[count : self.filled].clone()
        self.filled = kept
        return list(given.split(self.batch))


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
    """One SAELens training: feed it activations, it trains whenever a batch is ready; checkpoint,
    resume and export it."""

    def __init__(self, recipe: Recipe, checkpoint: Path | None = None):
        torch.manual_seed(recipe.seed)
        self.recipe = recipe
        sae_class, _ = ARCHITECTURES[recipe.architecture]
        self.progress = Progress()
        if checkpoint is None:
            sae = sae_class(recipe.sae_config())
        else:
            sae = sae_class.load_from_disk(checkpoint)
        self.trainer = SAETrainer(recipe.trainer_config(), sae, data_provider=iter(()))
        if checkpoint is not None:
            self.trainer.load_trainer_state(checkpoint)
            self.progress = Progress(**json.loads((checkpoint / STATE_FILE).read_text()))
            self.progress.resumes.append(self.progress.tokens)
        generator = torch.Generator().manual_seed(recipe.seed + self.progress.windows)
        self.buffer = ShuffleBuffer(
            recipe.buffer_tokens, recipe.d_in, recipe.batch_tokens, generator
        )
        if checkpoint is not None:  # the rows read but not yet trained on, as they were
            self.buffer.put(load_file(str(checkpoint / BUFFER_FILE))["rows"])

    @property
    def done(self) -> bool:
        """Whether every step has run."""
        return self.progress.steps >= self.recipe.steps

    @property
    def sae(self) -> TrainingSAE:
        """The SAE being trained."""
        return self.trainer.sae

    def feed(self, activations: torch.Tensor, through: int | None) -> int:
        """Rows `[n, d_in]`, read from the model up to corpus window `through` (None: replayed
        from the cache); trains on every batch that is ready. Returns the steps run."""
        if through is None:
            self.progress.replayed += len(activations)
        else:
            self.progress.windows = through
            self.progress.rows_read += len(activations)
        return self._train(self.buffer.put(activations.float()))

    def finish(self) -> int:
        """The corpus ended: train on what the buffer still holds."""
        return self._train(self.buffer.drain())

    def _train(self, batches: list[torch.Tensor]) -> int:
        ran = 0
        scaler = self.trainer.activation_scaler
        for batch in batches:
            if self.done:
                break
            if scaler.scaling_factor is None:  # the first batch sets the scale, once
                scaler.estimate_scaling_factor(self.recipe.d_in, iter([batch]), 1)
                self._centre(scaler(batch))
            output = self.trainer.step(batch)
            self.progress.steps += 1
            self.progress.tokens += len(batch)
            self.progress.record(self._point(output, scaler(batch)))
            self.trainer.maybe_reset_sparsity()
            self.trainer.n_training_steps += 1
            ran += 1
        return ran

    @torch.no_grad()
    def _centre(self, scaled: torch.Tensor) -> None:
        """Start the decoder bias at the activations' median (the TopK paper's b_pre): SAELens
        starts it at zero, and a residual stream's large shared offset then takes Adam thousands
        of steps to learn, which a short training does not have."""
        self.trainer.sae.b_dec.copy_(scaled.median(0).values.to(self.trainer.sae.b_dec.dtype))

    def _point(self, output, scaled: torch.Tensor) -> dict:
        """One point of the curves: losses, variance explained and L0 of this batch, and the
        fraction of latents dead by SAELens's count."""
        with torch.no_grad():
            residual = (output.sae_out.float() - scaled).pow(2).sum()
            total = (scaled - scaled.mean(0)).pow(2).sum()
            l0 = (output.feature_acts != 0).float().sum(-1).mean()
        return {
            "step": self.progress.steps,
            "tokens": self.progress.tokens,
            "loss": round(float(output.loss), 6),
            "fve": round(1.0 - float(residual / total), 6) if total > 0 else None,
            "l0": round(float(l0), 3),
            "dead": round(float(self.trainer.dead_neurons.float().mean()), 6),
        }

    def checkpoint(self, folder: Path) -> None:
        """Write the SAE, SAELens's trainer state and millm's progress, replacing the last
        checkpoint only once the new one is whole."""
        staging = folder.with_name(folder.name + ".new")
        shutil.rmtree(staging, ignore_errors=True)
        self.trainer.save_checkpoint(staging.name, base_path=staging.parent)
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
        """The SAE as SAELens's inference file (cfg.json + sae_weights.safetensors) with
        `provenance` under the cfg's metadata; the activation scale and the decoder norms are folded
        into the weights, so the file reads raw activations."""
        sae = self.trainer.sae
        scaler = self.trainer.activation_scaler
        self.trainer.set_final_sae_metadata()
        if scaler.scaling_factor is not None:
            sae.fold_activation_norm_scaling_factor(scaler.scaling_factor)
            scaler.scaling_factor = None
        if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False) and self.recipe.architecture == (
            "topk"
        ):
            sae.fold_W_dec_norm()  # TopK's rescaling becomes plain weights (SAELens's own fold)
        sae.cfg.metadata.millm_provenance = provenance
        sae.cfg.metadata.context_size = provenance.get("context_size")
        sae.cfg.metadata.dataset_path = provenance.get("corpus", {}).get("name")
        folder.mkdir(parents=True, exist_ok=True)
        sae.save_inference_model(folder)


class ActivationCache:
    """The activations of a training's first epoch on disk (float32 rows, appended), replayed by
    the later epochs a chunk at a time: the disk holds the corpus's activations, memory only the
    chunk read back. numpy: it is read on the job's thread."""

    def __init__(self, path: Path, d_in: int):
        self.path, self.d_in = path, d_in
        self.row_bytes = d_in * 4

    def truncate(self, rows: int) -> None:
        """Keep the first `rows` (a resumed training drops what came after its checkpoint)."""
        with self.path.open("ab") as handle:
            handle.truncate(rows * self.row_bytes)

    def append(self, activations: torch.Tensor) -> None:
        """Rows read from the model, at the end."""
        with self.path.open("ab") as handle:
            handle.write(activations.float().contiguous().numpy().tobytes())

    def chunks(self, start: int, rows: int):
        """The rows from `start` on, `rows` at a time, as tensors."""
        total = self.path.stat().st_size // self.row_bytes
        with self.path.open("rb") as handle:
            handle.seek(start * self.row_bytes)
            for first in range(start, total, rows):
                count = min(rows, total - first)
                data = handle.read(count * self.row_bytes)
                yield torch.frombuffer(bytearray(data), dtype=torch.float32).view(count, self.d_in)


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
