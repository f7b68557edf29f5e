"""Cross-layer transcoders (`model_kind: cross_layer_transcoder`) in the layout circuit-tracer's
CrossLayerTranscoder.to_safetensors writes: `W_enc_{i}.safetensors` (`W_enc_{i}` `[d_transcoder,
d_model]`, `b_enc_{i}`, `b_dec_{i}`, `threshold_{i}` for a JumpReLU) and `W_dec_{i}.safetensors`
(`W_dec_{i}` `[d_transcoder, n_layers - i, d_model]`): block i's features read block i's MLP
input and write into the MLP output of every block from i on. Each block reads as a transcoder
whose own write is `W_dec_{i}[:, 0]`, with its whole decoder kept (`SAE.cross`); one block's
encoder file is an SAE of its own, as a set's file is.

Gemma Scope 2's CLTs come as one file per layer (the config's `transcoders` list), each a
JumpReLUMultiLayerSAE: `w_enc` `[d_model, d]`, `w_dec` `[d, n_layers, d_model]` (block i writes
its slices i..), `b_enc`, `b_dec`, `threshold` and `affine_skip_connection` (added as x @ it to
the block's own output), read as circuit-tracer's load_gemma_scope_2_clt reads them.
"""

from __future__ import annotations

from pathlib import Path

from millm.interp.sae import SAE, SAEWeights
from millm.interp.transcoder_files import (
    MAX_LAYERS,
    TranscoderBlock,
    TranscoderFileError,
    TranscoderSet,
    assembled,
    block_of,
    read_tensors,
    sae_of,
    set_files,
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


def _blocks(directory: Path) -> tuple[dict[int, Path], dict[int, Path]]:
    """The encoder and decoder files by block, as many of each."""
    encoders, decoders = _numbered(directory, "W_enc_"), _numbered(directory, "W_dec_")
    if len(decoders) != len(encoders):
        raise TranscoderFileError(
            f"{directory}: {len(encoders)} encoder files but {len(decoders)} decoder files"
        )
    return encoders, decoders


def _block(directory: Path, i: int, blocks: int, encoder: Path, decoder: Path) -> SAE:
    """Block i of `blocks` as a transcoder whose `cross` is its whole decoder."""
    tensors = read_tensors(encoder) | read_tensors(decoder)
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
    sae = sae_of(
        SAEWeights(w_enc.T.contiguous(), b_enc, w_dec[:, 0].contiguous(), b_dec), threshold
    )
    sae.cross = w_dec.contiguous()
    return sae


def _gemma_scope_2_block(path: Path, i: int, blocks: int) -> SAE:
    """Block i of a Gemma Scope 2 CLT of `blocks` layers (one params file; names as renamed on
    reading)."""
    tensors = read_tensors(path)
    missing = [k for k in ("W_enc", "W_dec", "b_enc", "b_dec") if k not in tensors]
    if missing:
        raise TranscoderFileError(f"{path} lacks {', '.join(missing)}")
    w_enc, w_dec = tensors["W_enc"], tensors["W_dec"]
    width, d_model = w_enc.shape
    if tuple(w_dec.shape) != (width, blocks, d_model):
        raise TranscoderFileError(
            f"{path}: w_dec is {tuple(w_dec.shape)}, expected {(width, blocks, d_model)} (a "
            "decoder to every layer)"
        )
    cross = w_dec[:, i:].contiguous()
    threshold = tensors.get("activation_function.threshold")
    sae = sae_of(
        SAEWeights(
            w_enc.T.contiguous(), tensors["b_enc"], cross[:, 0].contiguous(), tensors["b_dec"]
        ),
        threshold,
    )
    sae.cross, sae.W_skip = cross, tensors.get("W_skip")
    return sae


def read_cross_layer(directory: Path, config: dict) -> TranscoderSet:
    """The CLT in `directory`, every block."""
    if "transcoders" in config:  # Gemma Scope 2's: one listed params file per layer
        files = set_files(directory, config)
        layers = {i: _gemma_scope_2_block(path, i, len(files)) for i, path in files.items()}
        skips = {i: sae.W_skip for i, sae in layers.items() if sae.W_skip is not None}
        return assembled(directory, config, layers, files, skips)
    encoders, decoders = _blocks(directory)
    layers = {
        i: _block(directory, i, len(encoders), path, decoders[i]) for i, path in encoders.items()
    }
    return assembled(directory, config, layers, encoders, {})


def read_cross_layer_block(directory: Path, config: dict, path: Path) -> TranscoderBlock:
    """One block of the CLT in `directory`, from its encoder file `path` (Gemma Scope 2's: its
    params file)."""
    if "transcoders" in config:
        files = set_files(directory, config)
        block = block_of(files, path, f"the files {directory} lists")
        sae = _gemma_scope_2_block(path, block, len(files))
        return TranscoderBlock(block, sae, config["feature_input_hook"], path)
    encoders, decoders = _blocks(directory)
    block = block_of(encoders, path, f"{directory}'s encoder files (W_enc_{{i}}.safetensors)")
    sae = _block(directory, block, len(encoders), path, decoders[block])
    return TranscoderBlock(block, sae, config["feature_input_hook"], path, (decoders[block],))
