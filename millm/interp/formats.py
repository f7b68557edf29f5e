"""Reading SAE files: a SAELens directory, a Gemma Scope `params.npz`, or one transcoder file of a
circuit-tracer set (transcoders.py; hook point `mlp`), validated before use.

Every problem a file can have (a missing tensor, a wrong or transposed shape, an unknown
architecture, a hook point millm cannot steer) becomes an SAEFormatError whose message names
it, which the API answers as a 400. The JSON files are pydantic models, so a problem in one
names its key: `cfg.json: d_sae: Input should be greater than 0 (got 0)`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from millm.errors import SAEFormatError
from millm.interp.sae import SAE, JumpReLUSAE, SAEWeights, StandardSAE, TopKSAE
from millm.interp.transcoder_files import TranscoderFileError, block_labels, set_directory
from millm.interp.transcoders import read_block

SAELENS_CONFIG = "cfg.json"
SAELENS_WEIGHTS = "sae_weights.safetensors"
GEMMA_SCOPE_FILE = "params.npz"
LABELS_FILE = "feature_labels.json"
HOOK_NAME = re.compile(r"^blocks\.(\d+)\.hook_resid_(post|pre)$")
PositiveInt = Annotated[int, Field(strict=True, gt=0)]  # strict: "64", 64.0 and true are refused


def _architecture(value: Any) -> Any:
    # Case-insensitive, and "relu" is SAELens's other name for standard.
    name = value.lower() if isinstance(value, str) else value
    return "standard" if name == "relu" else name


class SAELensConfig(BaseModel):
    """The cfg.json keys millm uses; the many others SAELens writes are accepted and ignored."""

    architecture: Annotated[
        Literal["standard", "jumprelu", "topk"], BeforeValidator(_architecture)
    ] = "standard"
    d_in: PositiveInt
    d_sae: PositiveInt
    hook_name: str | None = None
    hook_layer: Annotated[int, Field(strict=True, ge=0)] | None = (
        None  # older files name no hook_name
    )
    k: PositiveInt | None = None  # TopK only
    apply_b_dec_to_input: bool | None = True  # null reads as false, as before
    # Early SAELens wrote normalize_activations as a bool: false (or null) means none.
    normalize_activations: Annotated[
        Literal["none", "expected_average_only_in", "constant_norm_rescale", "layer_norm"],
        BeforeValidator(lambda v: v or "none"),
    ] = "none"
    norm_scaling_factor: float | None = None
    model_name: str | None = None
    neuronpedia_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _flatten(cls, raw: Any) -> Any:
        # Newer SAELens releases nest hook and model fields under "metadata" (or "meta"), TopK's
        # k sometimes sits under activation_fn_kwargs, and older files call the factor scaling_factor.
        if not isinstance(raw, dict):
            return raw
        config = dict(raw)
        for nested in ("metadata", "meta", "activation_fn_kwargs"):
            inner = raw.get(nested)
            for key, value in inner.items() if isinstance(inner, dict) else ():
                if config.get(key) is None:
                    config[key] = value
        config["norm_scaling_factor"] = config.get("norm_scaling_factor") or config.get(
            "scaling_factor"
        )
        return config


CONFIG = TypeAdapter(SAELensConfig)
LABELS = TypeAdapter(
    dict[int, Any]
)  # feature index (a string of digits in JSON) -> entry or bare label


def _validated(adapter: TypeAdapter, path: Path) -> Any:
    """The JSON file at `path` validated by `adapter`; SAEFormatError naming each problem's location."""
    try:
        return adapter.validate_json(path.read_bytes())
    except ValidationError as exc:
        raise SAEFormatError(
            f"{path.name}: " + "; ".join(map(_problem, exc.errors(include_url=False)))
        ) from None


def _problem(error: ErrorDetails) -> str:
    """One pydantic error as 'd_sae: Input should be greater than 0 (got 0)'."""
    where = ".".join(str(part) for part in error["loc"] if part != "[key]")
    shown = error["type"] not in ("missing", "json_invalid") and not isinstance(
        error["input"], (dict, list)
    )
    return (
        (f"{where}: " if where else "")
        + error["msg"]
        + (f" (got {error['input']!r})" if shown else "")
    )


@dataclass(frozen=True)
class SAEInfo:
    """What the registry records about an SAE file (JSON-serialisable)."""

    id: str
    format: str  # "saelens" | "gemma_scope" | "transcoder"
    path: str  # the directory (SAELens), the params.npz file, or the transcoder file
    architecture: str
    d_in: int
    d_sae: int
    layer: int | None
    hook_point: str  # "resid_post" | "resid_pre" | "mlp" (a transcoder: reads the MLP input, writes its output)
    hook_name: str | None
    k: int | None = None
    model_name: str | None = None
    neuronpedia_id: str | None = None
    has_labels: bool = False

    def to_dict(self) -> dict:
        """A plain dict for storage and responses."""
        return asdict(self)


def content_id(path: Path, *also: Path) -> str:
    """sae_ + the first 12 hex digits of the weights file's SHA-256 (and of the files `also` after
    it, for weights kept in several): the same file has the same id anywhere."""
    digest = hashlib.sha256()
    for part in (path, *also):
        with part.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return "sae_" + digest.hexdigest()[:12]


def parse_hook_name(hook_name: str) -> tuple[int, str]:
    """(layer, 'resid_post' | 'resid_pre') for blocks.L.hook_resid_*; anything else is refused."""
    match = HOOK_NAME.match(hook_name)
    if not match:
        raise SAEFormatError(
            f"hook point {hook_name!r} is not supported: millm steers the residual stream "
            "(blocks.L.hook_resid_post or blocks.L.hook_resid_pre)"
        )
    return int(match.group(1)), f"resid_{match.group(2)}"


def _hook(config: SAELensConfig) -> tuple[int, str]:
    """(layer, hook point) from hook_name, or from hook_layer (resid_post) in older files."""
    if config.hook_name:
        return parse_hook_name(config.hook_name)
    if config.hook_layer is not None:
        return config.hook_layer, "resid_post"
    raise SAEFormatError(f"{SAELENS_CONFIG} names no hook_name (or hook_layer)")


def _expect_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], meaning: str) -> None:
    if tuple(tensor.shape) == shape:
        return
    if len(shape) == 2 and tuple(tensor.shape) == shape[::-1]:
        raise SAEFormatError(
            f"{name} is transposed: expected {meaning} = {list(shape)}, got {list(tensor.shape)}"
        )
    raise SAEFormatError(
        f"{name} has shape {list(tensor.shape)}, expected {meaning} = {list(shape)}"
    )


def _weights(tensors: dict[str, torch.Tensor], d_in: int, d_sae: int, source: str) -> SAEWeights:
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        if name not in tensors:
            raise SAEFormatError(f"{source} has no tensor {name!r} (found: {sorted(tensors)})")
    _expect_shape("W_enc", tensors["W_enc"], (d_in, d_sae), "[d_in, d_sae]")
    _expect_shape("W_dec", tensors["W_dec"], (d_sae, d_in), "[d_sae, d_in]")
    _expect_shape("b_enc", tensors["b_enc"], (d_sae,), "[d_sae]")
    _expect_shape("b_dec", tensors["b_dec"], (d_in,), "[d_in]")
    return SAEWeights(
        *(tensors[n].float().contiguous() for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    )


def _threshold(tensors: dict[str, torch.Tensor], d_sae: int, source: str) -> torch.Tensor:
    if "threshold" in tensors:
        threshold = tensors["threshold"].float()
    elif "log_threshold" in tensors:
        threshold = tensors["log_threshold"].float().exp()
    else:
        raise SAEFormatError(
            f"{source} is a JumpReLU SAE without a 'threshold' (or 'log_threshold') tensor; "
            "treating it as ReLU would give wrong activations"
        )
    _expect_shape("threshold", threshold, (d_sae,), "[d_sae]")
    return threshold.contiguous()


def read_saelens(directory: Path) -> tuple[SAEInfo, SAE]:
    """A SAELens directory: cfg.json + sae_weights.safetensors (+ feature_labels.json)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config_path, weights_path = directory / SAELENS_CONFIG, directory / SAELENS_WEIGHTS
    for required in (config_path, weights_path):
        if not required.is_file():
            raise SAEFormatError(f"SAELens directory {directory} has no {required.name}")
    config: SAELensConfig = _validated(CONFIG, config_path)
    layer, hook_point = _hook(config)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise SAEFormatError(
            f"{weights_path.name} is not a readable safetensors file: {exc}"
        ) from None
    weights = _weights(tensors, config.d_in, config.d_sae, SAELENS_WEIGHTS)
    normalisation = config.normalize_activations
    if normalisation == "expected_average_only_in":
        # SAELens applies this scaling outside the SAE at training time and folds the factor
        # into the weights when it is published; at run time the SAE itself is the identity.
        factor = config.norm_scaling_factor
        if factor:
            weights.W_enc, weights.W_dec, weights.b_dec = (
                weights.W_enc * factor,
                weights.W_dec / factor,
                weights.b_dec / factor,
            )
        normalisation = "none"
    options: dict[str, Any] = {
        "apply_b_dec_to_input": bool(config.apply_b_dec_to_input),
        "normalize_activations": normalisation,
    }
    if config.architecture == "jumprelu":
        sae: SAE = JumpReLUSAE(
            weights, _threshold(tensors, config.d_sae, SAELENS_WEIGHTS), **options
        )
    elif config.architecture == "topk":
        if config.k is None or config.k > config.d_sae:
            raise SAEFormatError(
                f"{SAELENS_CONFIG}: k: a topk SAE needs k between 1 and d_sae ({config.d_sae}), got {config.k!r}"
            )
        sae = TopKSAE(weights, config.k, **options)
    else:
        sae = StandardSAE(weights, **options)
    info = SAEInfo(
        id=content_id(weights_path),
        format="saelens",
        path=str(directory),
        layer=layer,
        hook_point=hook_point,
        hook_name=config.hook_name or None,
        k=config.k if config.architecture == "topk" else None,
        has_labels=(directory / LABELS_FILE).is_file(),
        **config.model_dump(
            include={"architecture", "d_in", "d_sae", "model_name", "neuronpedia_id"}
        ),
    )
    return info, sae


def read_gemma_scope(path: Path) -> tuple[SAEInfo, SAE]:
    """A Gemma Scope params.npz (JumpReLU); width from the shapes, layer from the path's layer_N."""
    try:
        with np.load(path) as archive:
            arrays = {
                name: torch.from_numpy(np.asarray(archive[name], dtype=np.float32))
                for name in archive.files
            }
    except (OSError, ValueError) as exc:
        raise SAEFormatError(f"{path.name} is not a readable .npz file: {exc}") from None
    tensors = {
        {"w_enc": "W_enc", "w_dec": "W_dec"}.get(name, name): value
        for name, value in arrays.items()
    }
    for name in ("b_enc", "b_dec"):
        if name not in tensors:
            raise SAEFormatError(f"{path.name} has no array {name!r} (found: {sorted(arrays)})")
    d_in, d_sae = int(tensors["b_dec"].shape[0]), int(tensors["b_enc"].shape[0])
    weights = _weights(tensors, d_in, d_sae, path.name)
    sae = JumpReLUSAE(weights, _threshold(tensors, d_sae, path.name), apply_b_dec_to_input=False)
    layer_match = re.search(r"layer_(\d+)", str(path))
    info = SAEInfo(
        id=content_id(path),
        format="gemma_scope",
        path=str(path),
        architecture="jumprelu",
        d_in=d_in,
        d_sae=d_sae,
        layer=int(layer_match.group(1)) if layer_match else None,
        hook_point="resid_post",
        hook_name=f"blocks.{layer_match.group(1)}.hook_resid_post" if layer_match else None,
        has_labels=(path.parent / LABELS_FILE).is_file(),
    )
    return info, sae


def read_transcoder(path: Path) -> tuple[SAEInfo, SAE]:
    """One transcoder file of a circuit-tracer set, as an SAE hooked at its block's MLP."""
    try:
        found = read_block(path)
    except TranscoderFileError as exc:
        raise SAEFormatError(str(exc)) from None
    sae = found.sae
    info = SAEInfo(
        id=content_id(path, *found.also),
        format="transcoder",
        path=str(path),
        architecture=sae.architecture,
        d_in=sae.d_in,
        d_sae=sae.d_sae,
        layer=found.block,
        hook_point="mlp",
        hook_name=f"blocks.{found.block}.{found.input_hook}",
        has_labels=path.with_suffix(".labels.json").is_file(),
    )
    return info, sae


def read_sae(path: Path) -> tuple[SAEInfo, SAE]:
    """Read whichever format `path` holds (a SAELens directory, a params.npz or a folder with one,
    a transcoder file of a set)."""
    if set_directory(path) is not None:
        return read_transcoder(path)
    if path.is_dir():
        if (path / SAELENS_CONFIG).is_file() or (path / SAELENS_WEIGHTS).is_file():
            return read_saelens(path)
        if (path / GEMMA_SCOPE_FILE).is_file():
            return read_gemma_scope(path / GEMMA_SCOPE_FILE)
        raise SAEFormatError(
            f"{path} holds neither a SAELens SAE (cfg.json + {SAELENS_WEIGHTS}) nor a {GEMMA_SCOPE_FILE}"
        )
    if path.is_file() and path.suffix == ".npz":
        return read_gemma_scope(path)
    if path.is_file() and path.name in (SAELENS_CONFIG, SAELENS_WEIGHTS):
        return read_saelens(path.parent)
    raise SAEFormatError(
        f"{path} is not an SAE: give a SAELens directory, a Gemma Scope params.npz or one "
        "transcoder file of a set (beside its config.yaml)"
    )


def read_labels(info: SAEInfo) -> dict[int, dict]:
    """The SAE's shipped feature labels (index -> {label, top_tokens, ...}), or {} when it has none."""
    if info.format == "transcoder":
        try:
            return block_labels(Path(info.path), info.d_sae)
        except TranscoderFileError as exc:
            raise SAEFormatError(str(exc)) from None
    folder = Path(info.path) if info.format == "saelens" else Path(info.path).parent
    path = folder / LABELS_FILE
    if not path.is_file():
        return {}
    labels = _validated(LABELS, path)
    return {
        index: entry if isinstance(entry, dict) else {"label": str(entry)}
        for index, entry in labels.items()
    }
