"""How an exception inside a job becomes the error its requests are answered with: a device out
of memory is 503 insufficient_memory (serving goes on), anything unnamed a logged 500."""

from __future__ import annotations

import logging

import torch

from millm.errors import GenerationFailed, InsufficientMemory, MillmError, describe

log = logging.getLogger(__name__)

# CUDA raises torch.OutOfMemoryError; the CPU allocator raises a plain RuntimeError saying so.
CPU_OOM_MESSAGES = ("can't allocate memory", "not enough memory")


def out_of_memory(exc: Exception) -> bool:
    """Whether a device (CUDA or the CPU's allocator) ran out of memory."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in CPU_OOM_MESSAGES)


def as_error(device: torch.device, exc: Exception) -> MillmError:
    """The error a job's requests get for `exc` (a MillmError as it is)."""
    if isinstance(exc, MillmError):
        return exc
    if out_of_memory(exc):
        return InsufficientMemory(
            f"{device} ran out of memory during generation: the prompt and its KV cache do "
            "not fit beside the model; shorten the prompt or max_tokens"
        )
    log.exception("generation failed")
    return GenerationFailed(f"generation failed: {describe(exc)}")
