"""What a training request comes to on the loaded model: its recipe, each bound of memory and disk
checked before anything runs."""

from __future__ import annotations

from millm.engine.families import supported
from millm.errors import InvalidRequest
from millm.interp.dictionary_recipes import WITH_K, Recipe
from millm.lab.dictionaries.protocol import TrainRequest
from millm.settings import Settings

DEFAULT_K = 32
DEFAULT_BUFFER_BATCHES = 16


def recipe_of(body: TrainRequest, lm, settings: Settings) -> Recipe:
    """The training a request asks for on the loaded model `lm`, checked against the settings'
    bounds (a 400 naming the field)."""
    depth, width = int(lm.config.num_hidden_layers), int(lm.config.hidden_size)
    if body.layer is not None and body.layer >= depth:
        raise InvalidRequest(
            f"layer: {lm.name} has {depth} layers (0 to {depth - 1}), got {body.layer}",
            param="layer",
        )
    blocks = depth if body.kind == "transcoder_set" else 0
    if blocks and not supported(lm.config):
        raise InvalidRequest(
            f"kind: transcoders are trained on the MLPs of the lean runner's families; "
            f"{lm.name} ({lm.config.model_type}) runs on transformers' own forward",
            param="kind",
        )
    d_sae = body.d_sae or 8 * width
    k = body.k or (DEFAULT_K if body.trained in WITH_K else None)
    if k is not None and k > d_sae:
        raise InvalidRequest(f"k ({k}) is more than d_sae ({d_sae})", param="k")
    widths = body.matryoshka_widths
    if widths is not None and (widths != sorted(set(widths)) or widths[-1] != d_sae):
        raise InvalidRequest(
            f"matryoshka_widths must increase and end at d_sae ({d_sae}), got {widths}",
            param="matryoshka_widths",
        )
    row = (2 * blocks if blocks else 1) * width  # floats per activation row
    cap = settings.dictionary_buffer_bytes
    # by default 16 batches, or as many as the cap holds (a set's rows are every block's), at
    # least the two a shuffle needs
    batch = body.batch_tokens
    fits = cap // (row * 4) // batch * batch
    buffer = body.buffer_tokens or max(2 * batch, min(DEFAULT_BUFFER_BATCHES * batch, fits))
    if buffer < 2 * body.batch_tokens:
        raise InvalidRequest(
            f"buffer_tokens ({buffer}) must hold two batches ({2 * body.batch_tokens}) to mix them",
            param="buffer_tokens",
        )
    # weights, gradients and Adam's two moments, float32, of every dictionary trained
    state = 16 * max(1, blocks) * (2 * d_sae * width + d_sae + width
                                   + (width * width if body.skip else 0))  # fmt: skip
    # a set's targets: every block's MLP re-run in float32 (a gated MLP's three matrices), a copy
    # the training holds for its length
    mlps = 4 * blocks * 3 * width * (getattr(lm.config, "intermediate_size", None) or 4 * width)
    if state + mlps > settings.dictionary_max_bytes:
        what = f"{blocks} transcoders" if blocks else "an SAE"
        held = f" with the blocks' MLPs in float32 ({mlps / 2**30:.1f} GiB)" if blocks else ""
        most = settings.dictionary_max_bytes
        fix = "raise it to train on this model" if mlps >= most else "use fewer latents"
        raise InvalidRequest(
            f"d_sae: {what} of {d_sae} latents over a width of {width} take "
            f"{(state + mlps) / 2**30:.1f} GiB to train{held}, over MILLM_DICTIONARY_MAX_BYTES "
            f"({most / 2**30:.1f} GiB); {fix}",
            param="d_sae",
        )
    if buffer * row * 4 > cap:
        raise InvalidRequest(
            f"buffer_tokens: {buffer} rows of {row} float32 are "
            f"{buffer * row * 4 / 2**20:.0f} MiB, over MILLM_DICTIONARY_BUFFER_BYTES "
            f"({cap / 2**20:.0f} MiB); use a smaller buffer"
            + (" or smaller batches" if body.buffer_tokens is None else ""),
            param="buffer_tokens",
        )
    recipe = Recipe(
        architecture=body.trained,
        d_in=width,
        d_sae=d_sae,
        # a set's blocks name their own hooks (Recipe.sae_config)
        hook_name=f"blocks.{body.layer}.hook_{body.read_point}" if not blocks else "",
        model_name=lm.name,
        training_tokens=body.training_tokens,
        batch_tokens=body.batch_tokens,
        buffer_tokens=buffer,
        lr=body.lr,
        k=k,
        matryoshka_widths=tuple(widths) if widths else None,
        l0_coefficient=body.l0_coefficient or 1.0,
        seed=body.seed,
        epochs=body.epochs,
        dead_window_tokens=body.dead_window_tokens,
        transcoders=blocks,
        skip=body.skip,
    )
    cached = recipe.rows_per_epoch * row * 4 if body.epochs > 1 else 0
    if cached > settings.dictionary_cache_bytes:
        raise InvalidRequest(
            f"epochs: {recipe.rows_per_epoch} activations of {row} float32 kept on disk are "
            f"{cached / 2**30:.1f} GiB, over MILLM_DICTIONARY_CACHE_BYTES "
            f"({settings.dictionary_cache_bytes / 2**30:.1f} GiB); train on fewer "
            "tokens or with fewer epochs",
            param="epochs",
        )
    return recipe
