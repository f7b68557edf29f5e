"""Transcoder sets as circuit-tracer publishes them: one transcoder per block, each replacing its
block's MLP (reading the MLP's normalised input, writing its output), or a cross-layer
transcoder (cross_layer.py).

A set is a directory with circuit-tracer's `config.yaml` (`model_kind: transcoder_set`,
`feature_input_hook`, `feature_output_hook`, and either a `transcoders` list of files in block
order or files `layer_{i}.safetensors` beside it). A safetensors file holds circuit-tracer's
SingleLayerTranscoder: `W_enc` `[d_transcoder, d_model]`, `W_dec` `[d_transcoder, d_model]`,
`b_enc`, `b_dec`, and `activation_function.threshold` for a JumpReLU (ReLU without it); Gemma
Scope's and Gemma Scope 2's files are renamed on reading (transcoder_files.py). Each becomes the
SAE class of its activation (sae.py), with the encoder transposed to SAELens' layout. A skip
connection (`W_skip` `[d_model, d_model]`, adding x @ W_skip.T to the output) is kept beside its
transcoder.

One file of a set is also an SAE of its own (`read_block`): registered by its path like any SAE,
attached at its block, its features read at the MLP's input and written into the residual after
the block (hook point `mlp`), so they are inspected, calibrated and steered as SAE features are.
"""

from __future__ import annotations

from pathlib import Path

import torch

from millm.interp.cross_layer import read_cross_layer, read_cross_layer_block
from millm.interp.sae import SAE, SAEWeights
from millm.interp.transcoder_files import (
    TranscoderBlock,
    TranscoderFileError,
    TranscoderSet,
    assembled,
    block_of,
    read_config,
    read_tensors,
    sae_of,
    set_directory,
    set_files,
)


def _transcoder(path: Path, layer: int) -> tuple[SAE, torch.Tensor | None]:
    """A transcoder file's SAE and its skip connection (None without one)."""
    tensors = read_tensors(path)
    missing = [k for k in ("W_enc", "W_dec", "b_enc", "b_dec") if k not in tensors]
    if missing:
        raise TranscoderFileError(f"{path} lacks {', '.join(missing)}")
    w_enc, w_dec = tensors["W_enc"], tensors["W_dec"]
    width, d_model = w_enc.shape
    shapes = {
        "W_dec": (w_dec.shape, (width, d_model)),
        "b_enc": (tensors["b_enc"].shape, (width,)),
        "b_dec": (tensors["b_dec"].shape, (d_model,)),
    }
    if "W_skip" in tensors:
        shapes["W_skip"] = (tensors["W_skip"].shape, (d_model, d_model))
    for name, (shape, want) in shapes.items():
        if tuple(shape) != want:
            raise TranscoderFileError(
                f"{path}: {name} is {tuple(shape)}, expected {want} (from W_enc "
                f"{tuple(w_enc.shape)})"
            )
    weights = SAEWeights(w_enc.T.contiguous(), tensors["b_enc"], w_dec, tensors["b_dec"])
    skip = tensors.get("W_skip")
    threshold = tensors.get("activation_function.threshold")
    if threshold is not None and tuple(threshold.shape) != (width,):
        raise TranscoderFileError(
            f"{path}: the threshold is {tuple(threshold.shape)}, expected ({width},)"
        )
    return sae_of(weights, threshold), skip


def read_block(path: Path) -> TranscoderBlock:
    """The transcoder in file `path` of a set, with its block read from the set's config or file
    names."""
    directory = set_directory(path)
    if directory is None:
        raise TranscoderFileError(
            f"{path} is not a file of a transcoder set (no config.yaml above it)"
        )
    config = read_config(directory)
    if config["model_kind"] == "cross_layer_transcoder":
        return read_cross_layer_block(directory, config, path)
    files = set_files(directory, config)
    block = block_of(files, path, f"the transcoders {directory} lists")
    sae, skip = _transcoder(path, block)
    sae.W_skip = skip
    return TranscoderBlock(block, sae, config["feature_input_hook"], path)


def read_transcoder_set(directory: Path) -> TranscoderSet:
    """The set in `directory` (TranscoderFileError saying what is wrong)."""
    config = read_config(directory)
    if config["model_kind"] == "cross_layer_transcoder":
        return read_cross_layer(directory, config)
    files = set_files(directory, config)
    read = {layer: _transcoder(path, layer) for layer, path in files.items()}
    layers = {layer: sae for layer, (sae, _) in read.items()}
    skips = {layer: skip for layer, (_, skip) in read.items() if skip is not None}
    return assembled(directory, config, layers, files, skips)
