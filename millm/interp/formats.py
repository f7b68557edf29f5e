"""Reading SAE files: a SAELens directory, a published family's own layout (sae_layouts.py), or one
transcoder file of a circuit-tracer set (transcoders.py; hook point `mlp`), validated before use.

Every problem a file can have (a missing tensor, a wrong or transposed shape, an unknown
architecture, a hook point millm cannot steer) becomes an SAEFormatError whose message names
it, which the API answers as a 400. The JSON files are pydantic models, so a problem in one
names its key: `cfg.json: d_sae: Input should be greater than 0 (got 0)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, TypeAdapter, model_validator

from millm.errors import SAEFormatError
from millm.interp.sae import SAE, JumpReLUSAE, StandardSAE, TopKSAE
from millm.interp.sae_files import (
    LABELS_FILE,
    SAEInfo,
    content_id,
    parse_hook_name,
    threshold_from,
    validated,
    weights_from,
)
from millm.interp.sae_layouts import read_layout
from millm.interp.transcoder_files import TranscoderFileError, block_labels, set_directory
from millm.interp.transcoders import read_block

SAELENS_CONFIG = "cfg.json"
SAELENS_WEIGHTS = "sae_weights.safetensors"
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
        # Newer SAELens releases nest hook and model fields under "metadata" (or "meta"), TopK's k
        # sometimes sits under activation_fn_kwargs, and older files call the factor scaling_factor.
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
# feature index (a string of digits in JSON) -> entry or bare label
LABELS = TypeAdapter(dict[int, Any])


def _hook(config: SAELensConfig) -> tuple[int, str]:
    """(layer, hook point) from hook_name, or from hook_layer (resid_post) in older files."""
    if config.hook_name:
        return parse_hook_name(config.hook_name)
    if config.hook_layer is not None:
        return config.hook_layer, "resid_post"
    raise SAEFormatError(f"{SAELENS_CONFIG} names no hook_name (or hook_layer)")


def read_saelens(directory: Path) -> tuple[SAEInfo, SAE]:
    """A SAELens directory: cfg.json + sae_weights.safetensors (+ feature_labels.json)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config_path, weights_path = directory / SAELENS_CONFIG, directory / SAELENS_WEIGHTS
    for required in (config_path, weights_path):
        if not required.is_file():
            raise SAEFormatError(f"SAELens directory {directory} has no {required.name}")
    config: SAELensConfig = validated(CONFIG, config_path)
    layer, hook_point = _hook(config)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise SAEFormatError(
            f"{weights_path.name} is not a readable safetensors file: {exc}"
        ) from None
    weights = weights_from(tensors, config.d_in, config.d_sae, SAELENS_WEIGHTS)
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
            weights, threshold_from(tensors, config.d_sae, SAELENS_WEIGHTS), **options
        )
    elif config.architecture == "topk":
        if config.k is None or config.k > config.d_sae:
            raise SAEFormatError(
                f"{SAELENS_CONFIG}: k: a topk SAE needs k between 1 and d_sae ({config.d_sae}), "
                f"got {config.k!r}"
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
    """Read whichever format `path` holds: a SAELens directory, a published family's own layout
    (Gemma Scope, Gemma Scope 2, Llama Scope, sparsify; sae_layouts.py), a transcoder file of a
    set."""
    if set_directory(path) is not None:
        return read_transcoder(path)
    found = read_layout(path)
    if found is not None:
        return found
    if path.is_dir():
        if (path / SAELENS_CONFIG).is_file() or (path / SAELENS_WEIGHTS).is_file():
            return read_saelens(path)
        raise SAEFormatError(
            f"{path} holds no SAE millm knows: a SAELens folder (cfg.json + {SAELENS_WEIGHTS}), "
            "Gemma Scope (params.npz), Gemma Scope 2 (params.safetensors), Llama Scope "
            "(hyperparams.json + checkpoints/final.safetensors) or sparsify (cfg.json + "
            "sae.safetensors)"
        )
    if path.is_file() and path.name in (SAELENS_CONFIG, SAELENS_WEIGHTS):
        return read_saelens(path.parent)
    raise SAEFormatError(
        f"{path} is not an SAE: give an SAE's folder, a Gemma Scope params.npz or one "
        "transcoder file of a set (beside its config.yaml)"
    )


def read_labels(info: SAEInfo) -> dict[int, dict]:
    """The SAE's shipped feature labels (index -> {label, top_tokens, ...}), or {} when it has
    none."""
    if info.format == "transcoder":
        try:
            return block_labels(Path(info.path), info.d_sae)
        except TranscoderFileError as exc:
            raise SAEFormatError(str(exc)) from None
    folder = Path(info.path) if Path(info.path).is_dir() else Path(info.path).parent
    path = folder / LABELS_FILE
    if not path.is_file():
        return {}
    labels = validated(LABELS, path)
    return {
        index: entry if isinstance(entry, dict) else {"label": str(entry)}
        for index, entry in labels.items()
    }
