"""What every transcoder file reader shares: the set's config, a file's tensors in
circuit-tracer's names, the labels beside a file, and what a set or one of its blocks is.

Gemma Scope's `.npz` (`W_enc` `[d_model, d_transcoder]`, `threshold`) and Gemma Scope 2's
transcoder safetensors (`w_enc` `[d_model, d]`, `w_dec`, `threshold`, `affine_skip_connection`)
are renamed as circuit-tracer's load_gemma_scope_transcoder and load_gemma_scope_2_transcoder do;
a SAELens transcoder (a `cfg.json` beside its `sae_weights.safetensors`: `W_enc` `[d_model, d]`,
`threshold`, `W_skip` `[d_model, d_model]` added as x @ W_skip.T, as circuit-tracer's) likewise.
A file's labels lie beside it in any labels document millm imports (formats/labels.py):
`layer_3.safetensors` -> `layer_3.labels.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_file

from millm.errors import InvalidRequest
from millm.formats.labels import check_width, read_document
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
    kind: str = "transcoder_set"  # or "cross_layer_transcoder"

    @property
    def cross(self) -> dict[int, torch.Tensor]:
        """A CLT's blocks' whole decoders `[d_transcoder, n_layers - block, d_model]`
        (SAE.cross)."""
        return {block: sae.cross for block, sae in self.layers.items() if sae.cross is not None}


@dataclass(frozen=True)
class TranscoderBlock:
    """One transcoder file of a set, as an SAE of its own: its block, weights and the set's
    hooks."""

    block: int
    sae: SAE
    input_hook: str
    path: Path
    also: tuple[Path, ...] = ()  # other files its weights come from (a CLT block's decoder)


# How far above a file its set's config.yaml may be (Gemma Scope: layer_i/width/params.npz).
SET_DEPTH = 3


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
        if kind in KINDS:
            return directory
    return None


def read_config(directory: Path) -> dict:
    """The set's config.yaml, checked: a kind millm reads and the MLP's input and output hooks."""
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
            f"{path}: feature_input_hook {config.get('feature_input_hook')!r} is not the MLP's "
            f"input ({', '.join(INPUT_HOOKS)})"
        )
    if config.get("feature_output_hook") not in OUTPUT_HOOKS:
        raise TranscoderFileError(
            f"{path}: feature_output_hook {config.get('feature_output_hook')!r} is not the MLP's "
            f"output ({', '.join(OUTPUT_HOOKS)})"
        )
    return config


def set_files(directory: Path, config: dict) -> dict[int, Path]:
    """The files of a set by block: its config's `transcoders` list (each inside the directory),
    or its `layer_{i}.safetensors` files, every block up to the last (a gap is a lost file)."""
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
                f"config.yaml: transcoders[{layer}] is {entry!r}; give a file inside the set's "
                "directory (hub files: download the set first)"
            )
        path = (directory / entry).resolve()
        if not path.is_relative_to(directory.resolve()):
            raise TranscoderFileError(
                f"config.yaml: transcoders[{layer}] leaves the set's directory"
            )
        files[layer] = path
    return files


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A transcoder file's tensors (float32) in circuit-tracer's names."""
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
    if "w_enc" in tensors:
        return _gemma_scope_2(tensors)
    return _sae_lens(tensors, path) if _sae_lens_transcoder(path) else tensors


def _sae_lens_transcoder(path: Path) -> bool:
    """Whether `path` is a SAELens transcoder's weights (its cfg.json names a transcoder)."""
    config = path.with_name("cfg.json")
    if path.name != "sae_weights.safetensors" or not config.is_file():
        return False
    try:
        architecture = json.loads(config.read_text()).get("architecture", "")
    except (OSError, ValueError, AttributeError) as exc:
        raise TranscoderFileError(f"{config} cannot be read: {exc}") from None
    if not str(architecture).endswith("transcoder"):
        raise TranscoderFileError(
            f"{config}: architecture {architecture!r} is not a SAELens transcoder's"
        )
    return True


def _sae_lens(tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """A SAELens transcoder's tensors in circuit-tracer's names: W_enc `[d_model, d]`
    transposed, threshold renamed; W_skip is already `[d_out, d_in]`."""
    if "W_enc" not in tensors:
        raise TranscoderFileError(f"{path} has no W_enc")
    renamed = {"threshold": "activation_function.threshold"}
    out = {renamed.get(k, k): v for k, v in tensors.items() if k != "W_enc"}
    out["W_enc"] = tensors["W_enc"].T.contiguous()
    return out


def _gemma_scope_2(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gemma Scope 2's transcoder safetensors in circuit-tracer's names, as its
    load_gemma_scope_2_transcoder reads them: w_enc `[d_model, d]` transposed, threshold, and
    affine_skip_connection (added as x @ it) as W_skip `[d_model, d_model]` (added as x @
    W_skip.T)."""
    renamed = {
        {"w_dec": "W_dec", "threshold": "activation_function.threshold"}.get(k, k): v
        for k, v in tensors.items()
        if k not in ("w_enc", "affine_skip_connection")
    }
    renamed["W_enc"] = tensors["w_enc"].T.contiguous()
    if "affine_skip_connection" in tensors:
        renamed["W_skip"] = tensors["affine_skip_connection"].T.contiguous()
    return renamed


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


def block_of(files: dict[int, Path], path: Path, what: str) -> int:
    """Which block of a set file `path` is; TranscoderFileError "<file> is not one of <what>"
    when `files` (the set's, by block) do not hold it."""
    block = next((b for b, p in files.items() if p.resolve() == path.resolve()), None)
    if block is None:
        raise TranscoderFileError(f"{path.name} is not one of {what}")
    return block


def assembled(
    directory: Path,
    config: dict,
    layers: dict[int, SAE],
    files: dict[int, Path],
    skips: dict[int, torch.Tensor],
) -> TranscoderSet:
    """The set of these blocks' transcoders (their labels read beside their files), once they all
    read residuals of one width."""
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
        labels={block: block_labels(path, layers[block].d_sae) for block, path in files.items()},
        skips=skips,
        files=files,
        kind=config["model_kind"],
    )


def sae_of(weights: SAEWeights, threshold: torch.Tensor | None) -> SAE:
    """A transcoder's SAE: JumpReLU with a threshold, ReLU without; no b_dec subtracted from the
    input (circuit-tracer encodes x @ W_enc.T + b_enc)."""
    if threshold is None:
        return StandardSAE(weights, apply_b_dec_to_input=False)
    return JumpReLUSAE(weights, threshold, apply_b_dec_to_input=False)
