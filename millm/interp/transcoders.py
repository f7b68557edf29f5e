"""Transcoder sets as circuit-tracer publishes them: one transcoder per block, each replacing its
block's MLP (reading the MLP's normalised input, writing its output).

A set is a directory with circuit-tracer's `config.yaml` (`model_kind: transcoder_set`,
`feature_input_hook`, `feature_output_hook`, and either a `transcoders` list of files in block
order or files `layer_{i}.safetensors` beside it). A safetensors file holds circuit-tracer's
SingleLayerTranscoder: `W_enc` `[d_transcoder, d_model]`, `W_dec` `[d_transcoder, d_model]`,
`b_enc`, `b_dec`, and `activation_function.threshold` for a JumpReLU (ReLU without it); an
`.npz` file is Gemma Scope's (`W_enc` `[d_model, d_transcoder]`, `threshold`), as circuit-tracer's
load_gemma_scope_transcoder reads it. Each becomes the SAE class of its activation (sae.py), with
the encoder transposed to SAELens' layout and no b_dec subtracted from the input (circuit-tracer
encodes x @ W_enc.T + b_enc). A skip connection (`W_skip` `[d_model, d_model]`, adding
x @ W_skip.T to the output) is kept beside its transcoder.

Gemma Scope 2's transcoder safetensors (`w_enc` `[d_model, d]`, `w_dec`, `threshold`,
`affine_skip_connection`) are renamed as circuit-tracer's load_gemma_scope_2_transcoder does.

A cross-layer transcoder (`model_kind: cross_layer_transcoder`) is circuit-tracer's CLT in the
layout its `to_safetensors` writes: `W_enc_{i}.safetensors` (`W_enc_{i}` `[d_transcoder,
d_model]`, `b_enc_{i}`, `b_dec_{i}`, `threshold_{i}` for a JumpReLU) and `W_dec_{i}.safetensors`
(`W_dec_{i}` `[d_transcoder, n_layers - i, d_model]`: block i's features write into the MLP
output of every block from i on). Each block reads as a transcoder whose own write is
`W_dec_{i}[:, 0]`; the whole decoder is kept in `cross`.

A transcoder file may have its features' labels beside it, in any labels document millm imports
(labels.py): `layer_3.safetensors` -> `layer_3.labels.json`; graphs show them on their nodes.

One file of a set is also an SAE of its own (`read_block`): registered by its path like any SAE,
attached at its block, its features read at the MLP's input and written into the residual after
the block (hook point `mlp`), so they are inspected, calibrated and steered as SAE features are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_file

from millm.errors import InvalidRequest
from millm.interp.labels import check_width, read_document
from millm.interp.sae import SAE, JumpReLUSAE, SAEWeights, StandardSAE

# circuit-tracer's names for the MLP's normalised input and its output (TransformerLens hooks,
# and the ones its nnsight configurations use).
INPUT_HOOKS = ("mlp.hook_in", "ln2.hook_normalized")
OUTPUT_HOOKS = ("mlp.hook_out", "hook_mlp_out")
KINDS = ("transcoder_set", "cross_layer_transcoder")
MAX_LAYERS = 512


class TranscoderFileError(ValueError):
    """A transcoder set that cannot be read: the message says which file and why."""


@dataclass(frozen=True)
class TranscoderSet:
    """The transcoders of a set, by block, and what the set's files say of themselves."""

    layers: dict[int, SAE]
    d_model: int
    d_transcoder: int
    architecture: str
    input_hook: str
    output_hook: str
    labels: dict[int, dict[int, dict]]  # block -> feature -> {"label", <what the document said>}
    skips: dict[int, torch.Tensor]  # block -> W_skip [d_model, d_model], for those that have one
    files: dict[int, Path]  # block -> its transcoder's file (a CLT: its encoder's)
    cross: dict[
        int, torch.Tensor
    ]  # a CLT's block -> W_dec [d_transcoder, n_layers - block, d_model]
    kind: str = "transcoder_set"  # or "cross_layer_transcoder"


def _config(directory: Path) -> dict:
    path = directory / "config.yaml"
    if not path.is_file():
        raise TranscoderFileError(
            f"{directory} has no config.yaml (circuit-tracer's transcoder set config)"
        )
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TranscoderFileError(f"{path} is not YAML: {exc}") from None
    if not isinstance(config, dict):
        raise TranscoderFileError(f"{path} is not a mapping")
    kind = config.get("model_kind")
    if kind not in KINDS:
        raise TranscoderFileError(f"{path}: model_kind is {kind!r}, not one of {', '.join(KINDS)}")
    if config.get("feature_input_hook") not in INPUT_HOOKS:
        raise TranscoderFileError(
            f"{path}: feature_input_hook {config.get('feature_input_hook')!r} is not the MLP's input ({', '.join(INPUT_HOOKS)})"
        )
    if config.get("feature_output_hook") not in OUTPUT_HOOKS:
        raise TranscoderFileError(
            f"{path}: feature_output_hook {config.get('feature_output_hook')!r} is not the MLP's output ({', '.join(OUTPUT_HOOKS)})"
        )
    return config


def _files(directory: Path, config: dict) -> dict[int, Path]:
    listed = config.get("transcoders")
    if listed is None:
        found = {}
        for path in directory.glob("layer_*.safetensors"):
            try:
                found[int(path.stem.removeprefix("layer_"))] = path
            except ValueError:
                continue
        if not found:
            raise TranscoderFileError(
                f"{directory} lists no transcoders and holds no layer_*.safetensors"
            )
        missing = sorted(set(range(max(found) + 1)) - set(found))
        if missing:  # a gap is a lost file, not a set without those blocks
            names = ", ".join(f"layer_{i}.safetensors" for i in missing)
            raise TranscoderFileError(
                f"{directory} lacks {names} (its files run up to layer_{max(found)})"
            )
        return dict(sorted(found.items()))
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_LAYERS:
        raise TranscoderFileError(
            f"config.yaml: transcoders must be a list of 1..{MAX_LAYERS} files"
        )
    files = {}
    for layer, entry in enumerate(listed):
        if not isinstance(entry, str) or entry.startswith("hf://"):
            raise TranscoderFileError(
                f"config.yaml: transcoders[{layer}] is {entry!r}; give a file inside the set's directory (hub files: download the set first)"
            )
        path = (directory / entry).resolve()
        if not path.is_relative_to(directory.resolve()):
            raise TranscoderFileError(
                f"config.yaml: transcoders[{layer}] leaves the set's directory"
            )
        files[layer] = path
    return files


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise TranscoderFileError(f"{path} does not exist")
    try:
        if path.suffix == ".npz":
            with np.load(path) as data:
                tensors = {
                    k: torch.from_numpy(np.asarray(data[k], dtype=np.float32)) for k in data.files
                }
            tensors["W_enc"] = tensors["W_enc"].T.contiguous()  # Gemma Scope keeps [d_model, d]
            if "threshold" in tensors:
                tensors["activation_function.threshold"] = tensors.pop("threshold")
            return tensors
        tensors = {k: v.float() for k, v in load_file(str(path)).items()}
    except (OSError, ValueError, KeyError) as exc:
        raise TranscoderFileError(f"{path} cannot be read: {exc}") from None
    return _gemma_scope_2(tensors) if "w_enc" in tensors else tensors


def _gemma_scope_2(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gemma Scope 2's transcoder safetensors in circuit-tracer's names, as its
    load_gemma_scope_2_transcoder reads them: w_enc `[d_model, d]` transposed, threshold, and
    affine_skip_connection (added as x @ it) as W_skip `[d_model, d_model]` (added as x @ W_skip.T)."""
    renamed = {
        {"w_dec": "W_dec", "threshold": "activation_function.threshold"}.get(k, k): v
        for k, v in tensors.items()
        if k not in ("w_enc", "affine_skip_connection")
    }
    renamed["W_enc"] = tensors["w_enc"].T.contiguous()
    if "affine_skip_connection" in tensors:
        renamed["W_skip"] = tensors["affine_skip_connection"].T.contiguous()
    return renamed


def _transcoder(path: Path, layer: int) -> tuple[SAE, torch.Tensor | None]:
    """A transcoder file's SAE and its skip connection (None without one)."""
    tensors = _tensors(path)
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
                f"{path}: {name} is {tuple(shape)}, expected {want} (from W_enc {tuple(w_enc.shape)})"
            )
    weights = SAEWeights(w_enc.T.contiguous(), tensors["b_enc"], w_dec, tensors["b_dec"])
    skip = tensors.get("W_skip")
    threshold = tensors.get("activation_function.threshold")
    if threshold is None:
        return StandardSAE(weights, apply_b_dec_to_input=False), skip
    if tuple(threshold.shape) != (width,):
        raise TranscoderFileError(
            f"{path}: the threshold is {tuple(threshold.shape)}, expected ({width},)"
        )
    return JumpReLUSAE(weights, threshold, apply_b_dec_to_input=False), skip


@dataclass(frozen=True)
class Block:
    """One transcoder file of a set, as an SAE of its own: its block, weights and the set's hooks."""

    block: int
    sae: SAE
    input_hook: str
    path: Path


SET_DEPTH = (
    3  # how far above a file its set's config.yaml may be (Gemma Scope: layer_i/width/params.npz)
)


def set_directory(path: Path) -> Path | None:
    """The directory of the transcoder set that file `path` belongs to (a config.yaml of a
    transcoder kind at most SET_DEPTH folders up), or None: then it is not a transcoder."""
    if not path.is_file():
        return None
    for directory in list(path.parents)[:SET_DEPTH]:
        config = directory / "config.yaml"
        if not config.is_file():
            continue
        try:
            kind = (yaml.safe_load(config.read_text()) or {}).get("model_kind")
        except (yaml.YAMLError, AttributeError, OSError, UnicodeDecodeError):
            continue
        if kind in ("transcoder_set", "cross_layer_transcoder"):
            return directory
    return None


def read_block(path: Path) -> Block:
    """The transcoder in file `path` of a set, with its block read from the set's config or file names."""
    directory = set_directory(path)
    if directory is None:
        raise TranscoderFileError(
            f"{path} is not a file of a transcoder set (no config.yaml above it)"
        )
    config = _config(directory)
    if config["model_kind"] == "cross_layer_transcoder":
        raise TranscoderFileError(
            f"{path.name} belongs to a cross-layer transcoder, whose features write into every later "
            "block: not an SAE of one block. Register the set (POST /api/transcoders) for graphs"
        )
    files = _files(directory, config)
    block = next((b for b, p in files.items() if p.resolve() == path.resolve()), None)
    if block is None:
        raise TranscoderFileError(f"{path.name} is not one of the transcoders {directory} lists")
    sae, skip = _transcoder(path, block)
    sae.W_skip = skip
    return Block(block, sae, config["feature_input_hook"], path)


def block_labels(path: Path, width: int) -> dict[int, dict]:
    """The labels beside a transcoder file (none when there is no such file; TranscoderFileError
    when they do not fit)."""
    found = path.with_suffix(".labels.json")
    if not found.is_file():
        return {}
    try:
        document = read_document(found.read_bytes(), "application/json")
        check_width(document, width)
    except InvalidRequest as exc:
        raise TranscoderFileError(f"{found}: {exc.message}") from None
    return {label.index: {**label.detail, "label": label.label} for label in document.labels}


def read_transcoder_set(directory: Path) -> TranscoderSet:
    """The set in `directory` (TranscoderFileError saying what is wrong)."""
    config = _config(directory)
    if config["model_kind"] == "cross_layer_transcoder":
        return _cross_layer(directory, config)
    files = _files(directory, config)
    read = {layer: _transcoder(path, layer) for layer, path in files.items()}
    layers = {layer: sae for layer, (sae, _) in read.items()}
    widths = {sae.d_in for sae in layers.values()}
    if len(widths) != 1:
        raise TranscoderFileError(
            f"{directory}: the transcoders read residuals of different widths {sorted(widths)}"
        )
    first = next(iter(layers.values()))
    return TranscoderSet(
        layers=layers,
        d_model=first.d_in,
        d_transcoder=max(sae.d_sae for sae in layers.values()),
        architecture=first.architecture,
        input_hook=config["feature_input_hook"],
        output_hook=config["feature_output_hook"],
        labels={layer: block_labels(path, layers[layer].d_sae) for layer, path in files.items()},
        skips={layer: skip for layer, (_, skip) in read.items() if skip is not None},
        files=files,
        cross={},
    )


def _numbered(directory: Path, prefix: str) -> dict[int, Path]:
    """`{prefix}{i}.safetensors` by i, every i up to the last present (a gap is a lost file)."""
    found = {}
    for path in directory.glob(f"{prefix}*.safetensors"):
        number = path.stem.removeprefix(prefix)
        if number.isdigit():
            found[int(number)] = path
    if not found or len(found) > MAX_LAYERS:
        raise TranscoderFileError(f"{directory} holds no {prefix}*.safetensors (1..{MAX_LAYERS})")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise TranscoderFileError(f"{directory} lacks {prefix}{missing[0]}.safetensors")
    return dict(sorted(found.items()))


def _cross_layer(directory: Path, config: dict) -> TranscoderSet:
    """A CLT in circuit-tracer's layout (W_enc_{i}, W_dec_{i} files): each block as a transcoder
    whose own write is its decoder's first slice, and the whole decoder in `cross`."""
    encoders, decoders = _numbered(directory, "W_enc_"), _numbered(directory, "W_dec_")
    blocks = len(encoders)
    if len(decoders) != blocks:
        raise TranscoderFileError(
            f"{directory}: {blocks} encoder files but {len(decoders)} decoder files"
        )
    layers: dict[int, SAE] = {}
    cross = {}
    for i, path in encoders.items():
        tensors = _tensors(path) | _tensors(decoders[i])
        names = [f"W_enc_{i}", f"b_enc_{i}", f"b_dec_{i}", f"W_dec_{i}"]
        missing = [name for name in names if name not in tensors]
        if missing:
            raise TranscoderFileError(f"{directory}: block {i} lacks {', '.join(missing)}")
        w_enc, b_enc, b_dec, w_dec = (tensors[name] for name in names)
        width, d_model = w_enc.shape
        shapes = {
            f"b_enc_{i}": (b_enc.shape, (width,)),
            f"b_dec_{i}": (b_dec.shape, (d_model,)),
            f"W_dec_{i}": (w_dec.shape, (width, blocks - i, d_model)),
        }
        threshold = tensors.get(f"threshold_{i}")
        if threshold is not None:
            threshold = threshold.reshape(-1)
            shapes[f"threshold_{i}"] = (threshold.shape, (width,))
        for name, (shape, want) in shapes.items():
            if tuple(shape) != want:
                raise TranscoderFileError(f"{directory}: {name} is {tuple(shape)}, expected {want}")
        weights = SAEWeights(w_enc.T.contiguous(), b_enc, w_dec[:, 0].contiguous(), b_dec)
        layers[i] = (
            StandardSAE(weights, apply_b_dec_to_input=False)
            if threshold is None
            else JumpReLUSAE(weights, threshold, apply_b_dec_to_input=False)
        )
        cross[i] = w_dec.contiguous()
    widths = {sae.d_in for sae in layers.values()}
    if len(widths) != 1:
        raise TranscoderFileError(
            f"{directory}: the blocks read residuals of different widths {sorted(widths)}"
        )
    first = layers[0]
    return TranscoderSet(
        layers=layers,
        d_model=first.d_in,
        d_transcoder=max(sae.d_sae for sae in layers.values()),
        architecture=first.architecture,
        input_hook=config["feature_input_hook"],
        output_hook=config["feature_output_hook"],
        labels={i: block_labels(path, layers[i].d_sae) for i, path in encoders.items()},
        skips={},
        files=encoders,
        cross=cross,
        kind="cross_layer_transcoder",
    )
