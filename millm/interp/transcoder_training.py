"""Per-layer transcoders trained on SAELens 6's machinery, and written as SAELens's transcoders.

SAELens 6 trains SAEs only: its training step reconstructs its own input. A transcoder reads a
block's MLP input x and predicts the MLP's output y, so here a training row is the pair packed side
by side, `[x | y]`, and `TranscoderTraining` is SAELens's training step with that one change: the
architecture's encoder reads x, its decoder (plus a skip connection `x @ W_skip.T` when asked)
predicts y, and the mean squared error and the architecture's own auxiliary loss (BatchTopK's
AuxK for dead latents, JumpReLU's sparsity penalty) are taken against y. Everything else, the
optimiser, schedules, dead-latent counts, checkpoints and BatchTopK's running threshold, is
SAELens's, unchanged.

Only architectures that are JumpReLUs at inference are offered (BatchTopK, JumpReLU): that is what
SAELens's transcoder classes (`JumpReLUTranscoder`, `JumpReLUSkipTranscoder`), millm's transcoder
sets and circuit-tracer hold. Inputs and outputs are trained in units of their own typical size
(one scalar each, SAELens's "expected average norm sqrt(d)" rule, set from the first batch and
kept as buffers, so checkpoints hold them); the export folds both into the weights, so the file
reads and writes the model's own units. SAELens is imported where it is used (see
interp/dictionary_training.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

if TYPE_CHECKING:
    from sae_lens.saes.sae import TrainingSAE, TrainStepInput, TrainStepOutput

TRANSCODER_ARCHITECTURES = ("batchtopk", "jumprelu")
INPUT_HOOK, OUTPUT_HOOK = "mlp.hook_in", "mlp.hook_out"  # circuit-tracer's names, in config.yaml


def block_folder(block: int) -> str:
    """A block's transcoder folder inside a set (SAELens's cfg.json + sae_weights.safetensors)."""
    return f"layer_{block}"


class TranscoderTraining:
    """Mixed in front of a SAELens training class: its step reads rows `[x | y]` and trains the
    dictionary to map x to y (see the module's docstring)."""

    skip = False  # set by transcoder_class
    W_enc: torch.nn.Parameter
    W_dec: torch.nn.Parameter
    b_enc: torch.nn.Parameter
    b_dec: torch.nn.Parameter
    scale_in: torch.Tensor  # buffers: the training units of x and y
    scale_out: torch.Tensor

    def __init__(self, cfg, use_error_term: bool = False):
        super().__init__(cfg, use_error_term)  # type: ignore[call-arg]
        module: Any = self
        module.register_buffer("scale_in", torch.ones(()))
        module.register_buffer("scale_out", torch.ones(()))
        if self.skip:
            d = cfg.d_in
            self.W_skip = torch.nn.Parameter(torch.zeros(d, d, dtype=self.W_dec.dtype))

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed rows -> (x, y), each in its training units."""
        x, y = rows.chunk(2, dim=-1)
        return x * self.scale_in, y * self.scale_out

    @torch.no_grad()
    def start(self, rows: torch.Tensor) -> None:
        """Set from the first batch: each side's scale (its mean norm becomes sqrt(d)), the
        decoder bias at the outputs' median and the encoder bias centring the pre-activations
        (sparsify's initialisation: a short training has no time to learn large offsets)."""
        x, y = rows.float().chunk(2, dim=-1)
        d = x.shape[-1]
        self.scale_in.fill_(d**0.5 / float(x.norm(dim=-1).mean().clamp_min(1e-12)))
        self.scale_out.fill_(d**0.5 / float(y.norm(dim=-1).mean().clamp_min(1e-12)))
        x, y = self.split(rows.float())
        self.b_dec.copy_(y.median(0).values.to(self.b_dec.dtype))
        self.b_enc.copy_((-x.median(0).values @ self.W_enc).to(self.b_enc.dtype))

    def predict(self, x: torch.Tensor, feature_acts: torch.Tensor) -> torch.Tensor:
        """The predicted output of features `feature_acts` at input x (training units)."""
        out = self.decode(feature_acts)  # type: ignore[attr-defined]
        return out + x @ self.W_skip.T if self.skip else out

    def training_forward_pass(self, step_input: TrainStepInput) -> TrainStepOutput:
        """SAELens's training step (TrainingSAE.training_forward_pass) with x in and y as the
        target; the architecture's own steps around it kept (JumpReLU's threshold kept
        non-negative, BatchTopK's threshold updated)."""
        from sae_lens.saes.batchtopk_sae import BatchTopKTrainingSAE
        from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE
        from sae_lens.saes.sae import TrainStepOutput

        sae: Any = self
        if isinstance(self, JumpReLUTrainingSAE):
            with torch.no_grad():
                self.threshold.data.clamp_(min=0.0)
        x, y = self.split(step_input.sae_in)
        feature_acts, hidden_pre = sae.encode_with_hidden_pre(x)
        y_hat = self.predict(x, feature_acts)
        losses = {"mse_loss": sae.mse_loss_fn(y_hat, y).sum(dim=-1).mean()}
        aux = sae.calculate_aux_loss(
            step_input=dataclasses.replace(step_input, sae_in=y),
            feature_acts=feature_acts,
            hidden_pre=hidden_pre,
            sae_out=y_hat,
        )
        losses.update(aux if isinstance(aux, dict) else {"aux_loss": aux})
        output = TrainStepOutput(
            sae_in=y,
            sae_out=y_hat,
            feature_acts=feature_acts,
            hidden_pre=hidden_pre,
            loss=sum(losses.values(), torch.zeros(())),
            losses=losses,
        )
        if isinstance(self, BatchTopKTrainingSAE):
            self.update_topk_threshold(feature_acts)
        return output


_CLASSES: dict[tuple[type, bool], type] = {}


def transcoder_class(base: type[TrainingSAE], skip: bool) -> type:
    """The transcoder training class over SAELens's training class `base` (made once)."""
    key = (base, skip)
    if key not in _CLASSES:
        name = f"{base.__name__.removesuffix('SAE')}{'Skip' if skip else ''}Transcoder"
        _CLASSES[key] = type(name, (TranscoderTraining, base), {"skip": skip})
    return _CLASSES[key]


@torch.no_grad()
def save_transcoder(sae: Any, folder: Path, metadata: dict) -> None:
    """The trained transcoder as SAELens's inference transcoder (JumpReLU, with its skip
    connection when it has one) in `folder`, its training scales folded into the weights."""
    from sae_lens.saes.transcoder import (
        JumpReLUSkipTranscoder,
        JumpReLUSkipTranscoderConfig,
        JumpReLUTranscoder,
        JumpReLUTranscoderConfig,
    )

    state = {key: value.detach().clone() for key, value in sae.state_dict().items()}
    sae.process_state_dict_for_saving_inference(state)  # BatchTopK: its threshold, as a JumpReLU's
    s_in, s_out = float(state.pop("scale_in")), float(state.pop("scale_out"))
    folded = {
        "W_enc": state["W_enc"] * s_in,
        "b_enc": state["b_enc"],
        "W_dec": state["W_dec"] / s_out,
        "b_dec": state["b_dec"] / s_out,
        # kept non-negative as SAELens keeps it before each step (the last step may leave it under)
        "threshold": state["threshold"].float().clamp_min(0.0),
    }
    config_class, model_class = (
        (JumpReLUSkipTranscoderConfig, JumpReLUSkipTranscoder)
        if sae.skip
        else (JumpReLUTranscoderConfig, JumpReLUTranscoder)
    )
    if sae.skip:
        folded["W_skip"] = state["W_skip"] * (s_in / s_out)
    d_in, d_sae = folded["W_enc"].shape
    config = config_class(d_in=d_in, d_sae=d_sae, d_out=d_in, apply_b_dec_to_input=False)
    for key, value in metadata.items():
        setattr(config.metadata, key, value)
    transcoder = model_class(config)
    transcoder.load_state_dict({k: v.to(transcoder.W_enc.dtype) for k, v in folded.items()})
    transcoder.save_model(folder)


def write_set_config(folder: Path, model_name: str, blocks: int) -> None:
    """The set's config.yaml (circuit-tracer's transcoder-set config), its files the blocks'
    SAELens folders."""
    config = {
        "model_kind": "transcoder_set",
        "model_name": model_name,
        "feature_input_hook": INPUT_HOOK,
        "feature_output_hook": OUTPUT_HOOK,
        "transcoders": [
            f"{block_folder(block)}/sae_weights.safetensors" for block in range(blocks)
        ],
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
