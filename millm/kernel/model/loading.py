"""One model load, from its source to a model and its scheduler: the plan (engine, window, memory),
the checks that can refuse before anything is unloaded, then the load itself."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from millm.engine.loader import LoadedModel, load_model, pick_device
from millm.engine.loader_llamacpp import load_with_llamacpp
from millm.engine.scheduler import Scheduler
from millm.engine.sources import ModelSource
from millm.errors import ModelLoadFailed, ModelSourceError, describe
from millm.kernel.model.checkpoints import (
    check_memory,
    check_quantization,
    inspect,
    prefix_cache_budget,
)
from millm.kernel.model.engines import LLAMACPP, TRANSFORMERS, LoadPlan, plan_load
from millm.kernel.model.registry import ModelRegistry
from millm.settings import Settings

log = logging.getLogger(__name__)

# llama.cpp's own bound on sequences in one context is 256; the runner keeps one for itself.
LLAMACPP_SEQUENCES = 255


@dataclass(frozen=True)
class Planned:
    """A load that passed every check: where its weights come from and how they will run."""

    name: str
    source: ModelSource
    plan: LoadPlan


@dataclass(frozen=True)
class Outgoing:
    """The loaded model a load would replace, by name only: a reference would keep its weights
    alive."""

    name: str | None
    device: torch.device | None
    weights_bytes: int

    def reclaimable(self, device: torch.device) -> int:
        """Bytes the outgoing model frees on `device` when it is unloaded."""
        return self.weights_bytes if self.device == device else 0

    @property
    def kept(self) -> str:
        """The clause a refusal before the unload adds: the outgoing model stays."""
        return f"; {self.name!r} stays loaded" if self.name is not None else ""


def engine_for(settings: Settings, models: ModelRegistry, name: str, outgoing: Outgoing) -> str:
    """The engine a load of `name` would pick now (blocking: it reads the file's metadata)."""
    try:
        source = models.source(name)
        if not source.gguf_file:  # only a .gguf file can run on llama.cpp
            return TRANSFORMERS
        device = pick_device(settings.device)
        plan = plan_load(
            settings, source, inspect(source), device, outgoing.reclaimable(device), None
        )
        return plan.engine
    except (ModelSourceError, OSError):
        return TRANSFORMERS  # the load itself reports what is wrong with the source


def plan(
    settings: Settings,
    models: ModelRegistry,
    name: str,
    source: ModelSource,
    asked_window: int | None,
    outgoing: Outgoing,
) -> Planned:
    """Everything that can refuse a load, before the outgoing model is touched (model_load_failed,
    or the memory and quantisation refusals)."""
    try:
        checkpoint = inspect(source)
        device = pick_device(settings.device)
    except (ModelSourceError, OSError) as exc:
        raise ModelLoadFailed(
            f"could not load model {name!r}: {exc}{outgoing.kept}", param="model"
        ) from None
    models.note(name, source, checkpoint)
    reclaimable = outgoing.reclaimable(device)
    try:
        load_plan = plan_load(settings, source, checkpoint, device, reclaimable, asked_window)
    except ModelSourceError as exc:
        raise ModelLoadFailed(
            f"could not load model {name!r}: {exc}{outgoing.kept}", param="model"
        ) from None
    if load_plan.lowered_from is not None:
        log.warning(
            "model %r: its %d-token window does not fit in memory beside the file; loading it "
            "with %d tokens (--max-model-len sets it)",
            name,
            load_plan.lowered_from,
            load_plan.window,
        )
    if load_plan.engine == TRANSFORMERS:
        check_quantization(name, checkpoint)
    check_memory(
        name,
        load_plan.needed,
        device,
        reclaimable,
        settings.memory_limit_bytes,
        outgoing.name,
        load_plan.what,
    )
    return Planned(name, source, load_plan)


def load(settings: Settings, planned: Planned) -> LoadedModel:
    """Read the weights (ModelSourceError or anything else is raised as it came: the switch words
    it)."""
    dtype, cache, window, name = (
        settings.dtype,
        settings.cache_dir,
        planned.plan.window,
        planned.name,
    )
    if planned.plan.engine == LLAMACPP:
        # every row at once: the batch, a serial lane beside it, scoring between steps and a
        # batch's line paused beside them (engine/background.py)
        sequences = min(
            LLAMACPP_SEQUENCES, settings.max_batch_size + 2 * settings.max_rows_per_request + 1
        )
        lm = load_with_llamacpp(
            planned.source,
            dtype=dtype,
            cache_root=cache,
            sequences=sequences,
            max_model_len=window,
            served_name=name,
        )
    else:
        lm = load_model(
            planned.source,
            dtype=dtype,
            device=settings.device,
            cache_root=cache,
            max_model_len=window,
            served_name=name,
            reproducible=settings.reproducible,
        )
    return lm


def scheduler_for(settings: Settings, lm: LoadedModel) -> Scheduler:
    """The loaded model's scheduler, sized by the settings."""
    return Scheduler(
        lm,
        settings.max_pending_requests,
        batching=settings.enable_continuous_batching,
        max_batch=settings.max_batch_size,
        prefix_cache_bytes=prefix_cache_budget(settings.prefix_cache_bytes, lm.device),
        prefill_chunk=settings.prefill_chunk_tokens,
    )


def unloaded_before(outgoing: Outgoing) -> str:
    """What a failed load's client is told of the model unloaded to make room, if one was."""
    if outgoing.name is None:
        return ""
    return f" ({outgoing.name!r} was unloaded before the failure; no model is loaded now)"


def failure(name: str, exc: Exception) -> str:
    """Why a load failed, worded for the client: ModelSourceError says what; anything else is
    named."""
    return (
        str(exc)
        if isinstance(exc, ModelSourceError)
        else f"could not load model {name!r}: {describe(exc)}"
    )
