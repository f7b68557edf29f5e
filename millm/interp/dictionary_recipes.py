"""What a dictionary training trains: SAELens 6's architectures, and one training's recipe (its
architecture, hyperparameters, read point and length) as SAELens's training and trainer configs.

SAELens is imported where a recipe builds its configs, never at import (see
interp/dictionary_training.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from millm.interp.transcoder_training import transcoder_class

if TYPE_CHECKING:
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.sae import TrainingSAE

Architecture = Literal["topk", "batchtopk", "jumprelu", "matryoshka_batchtopk"]
WITH_K = ("topk", "batchtopk", "matryoshka_batchtopk")


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
    transcoders: int = 0  # a transcoder set: one per block, this many blocks (0: an SAE)
    skip: bool = False  # the transcoders have a skip connection

    @property
    def blocks(self) -> int:
        """Dictionaries trained side by side (a transcoder set's blocks, or the one SAE)."""
        return self.transcoders or 1

    @property
    def block_width(self) -> int:
        """Floats of one block's part of a row: `[x | y]` for a transcoder, x for an SAE."""
        return 2 * self.d_in if self.transcoders else self.d_in

    @property
    def row_width(self) -> int:
        """Floats of one activation row (every block's part)."""
        return self.blocks * self.block_width

    def training_class(self) -> type[TrainingSAE]:
        """SAELens's training class of the architecture (a transcoder's step over it)."""
        base, _ = architecture_classes(self.architecture)
        return transcoder_class(base, self.skip) if self.transcoders else base

    @property
    def steps(self) -> int:
        """Training steps in all."""
        return max(1, self.training_tokens // self.batch_tokens)

    @property
    def rows_per_epoch(self) -> int:
        """Activations read from the model (each then trained on `epochs` times)."""
        return math.ceil(self.steps * self.batch_tokens / self.epochs)

    def sae_config(self, block: int = 0):
        """The SAELens training config of this recipe (of a set's block `block`)."""
        _, config_class = architecture_classes(self.architecture)
        options: dict[str, Any] = {
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            # a transcoder scales its input and output itself, and reads x without b_dec
            "normalize_activations": "none" if self.transcoders else "expected_average_only_in",
            "apply_b_dec_to_input": not self.transcoders,
        }
        if self.architecture in WITH_K:
            options["k"] = self.k
        if self.architecture == "matryoshka_batchtopk":
            options["matryoshka_widths"] = list(self.matryoshka_widths or (self.d_sae,))
        if self.architecture == "jumprelu":
            options["l0_coefficient"] = self.l0_coefficient
        config = config_class(**options)
        config.metadata.hook_name = self.hook_name
        if self.transcoders:
            config.metadata.hook_name = f"blocks.{block}.hook_mlp_in"
            config.metadata.hook_name_out = f"blocks.{block}.hook_mlp_out"
        config.metadata.model_name = self.model_name
        return config

    def trainer_config(self) -> SAETrainerConfig:
        """SAELens's trainer config: Adam at `lr`, its last 20 % decayed linearly to nothing."""
        from sae_lens.config import SAETrainerConfig

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


def architecture_classes(architecture: str) -> tuple[type[TrainingSAE], type]:
    """SAELens's training class and config class of an architecture."""
    from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.matryoshka_batchtopk_sae import (
        MatryoshkaBatchTopKTrainingSAE,
        MatryoshkaBatchTopKTrainingSAEConfig,
    )
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

    return {
        "topk": (TopKTrainingSAE, TopKTrainingSAEConfig),
        "batchtopk": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig),
        "jumprelu": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig),
        "matryoshka_batchtopk": (
            MatryoshkaBatchTopKTrainingSAE,
            MatryoshkaBatchTopKTrainingSAEConfig,
        ),
    }[architecture]
