"""Choosing how a loaded model runs: which runner, which kernels, which precision where.

On the CPU the weights arrive in float32 and the kernels are built from them: float32 keeps
every matmul in float32; bfloat16 runs the layers in bfloat16 but keeps the output layer in
float32 (it decides the token, and a bf16 head alone cost half of the agreement with float32
greedy tokens in our measurements); a GGUF Q4_1 file's linears run on the int4 kernel over the
file's own codes. On CUDA the model runs as loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import torch

from millm.engine.kernels import KernelPlan
from millm.engine.kv_cache import RowKV
from millm.engine.runner_hf import HFRunner
from millm.engine.runner_lean import LeanPrefill, LeanRunner

T = TypeVar("T")


class Runner(Protocol):
    """What the engine asks of a runner (LeanRunner, HFRunner, LlamaCppRunner). A batch is the
    runner's own (LeanBatch, HFBatch) and only ever goes back to the runner that made it, hence
    Any."""

    name: str
    kernels: str
    mergeable: bool

    def prefill(self, prompts: list[list[int]], capacity: int) -> tuple[Any, torch.Tensor]: ...

    def step(self, batch: Any, next_ids: torch.Tensor) -> torch.Tensor: ...

    def select_rows(self, batch: Any, indices: list[int]) -> None: ...

    def merge(self, a: Any, b: Any, room: int) -> Any: ...

    def hidden_states(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def prompt_logits(self, sequence: list[int], start: int) -> torch.Tensor: ...


@dataclass
class WholePrefill:
    """A prefill on a runner that takes no chunks and no restored KV: one pass over every prompt."""

    prompts: list[list[int]]
    capacity: int
    batch: Any = None
    done: int = 0
    lengths: list[int] = field(init=False)
    reused: list[int] = field(init=False)

    def __post_init__(self):
        self.lengths = [len(p) for p in self.prompts]
        self.reused = [0] * len(self.prompts)

    @property
    def width(self) -> int:
        """Columns of the joining batch."""
        return max(self.lengths)

    @property
    def finished(self) -> bool:
        """Whether the pass has run."""
        return self.batch is not None

    def span(self, tokens: int | None) -> int:
        """Where the next pass ends: always the last column (one pass, whatever `tokens` says)."""
        return self.width


Prefill = LeanPrefill | WholePrefill


def begin_prefill(
    runner: Runner,
    prompts: list[list[int]],
    capacity: int,
    restored: list[RowKV | None] | None = None,
) -> Prefill:
    """A prefill of these prompts; on a chunked runner rows may bring their first positions' KV."""
    if getattr(runner, "chunked", False):
        return runner.begin(prompts, capacity, restored)  # type: ignore[attr-defined]  # chunked runners have begin (LeanRunner)
    return WholePrefill(prompts, capacity)


def advance_prefill(runner: Runner, prefill: Prefill, tokens: int | None) -> torch.Tensor | None:
    """Compute the next `tokens` columns (None, or a runner without chunks: all); the last pass
    returns logits `[B, V]`."""
    if isinstance(prefill, WholePrefill):
        prefill.batch, logits = runner.prefill(prefill.prompts, prefill.capacity)
        prefill.done = prefill.width
        return logits
    return runner.advance(prefill, tokens)  # type: ignore[attr-defined]  # a LeanPrefill comes from a LeanRunner


def prefill_steps(
    runner: Runner,
    prompts: list[list[int]],
    capacity: int,
    chunk: Callable[[], int | None] | None = None,
) -> Generator[None, object, tuple[Any, torch.Tensor]]:
    """`runner.prefill` as steps: on the lean runner a block at a time; on a chunked runner
    (llama.cpp) given `chunk`, the columns in chunks of `chunk()` tokens (asked before each; None:
    all that are left); else one step (transformers' forward)."""
    layers = getattr(runner, "prefill_layers", None)
    if layers is not None:
        return layers(prompts, capacity)
    if chunk is not None and getattr(runner, "chunked", False):
        return _chunks(runner, prompts, capacity, chunk)
    return _whole(partial(runner.prefill, prompts, capacity))


def _chunks(
    runner: Runner, prompts: list[list[int]], capacity: int, chunk: Callable[[], int | None]
) -> Generator[None, object, tuple[Any, torch.Tensor]]:
    prefill = begin_prefill(runner, prompts, capacity)
    while (logits := advance_prefill(runner, prefill, _no_single_column(prefill, chunk()))) is None:
        yield
    return prefill.batch, logits


def _no_single_column(prefill: Prefill, tokens: int | None) -> int | None:
    """`tokens`, or one more where it would leave one column for last: a one-token decode runs
    on matrix-vector kernels whose sums round otherwise than a prefill's."""
    if tokens is not None and prefill.width - prefill.done - tokens == 1:
        return tokens + 1
    return max(tokens, 2) if tokens is not None else None


def prompt_logits_steps(
    runner: Runner, sequence: list[int], start: int
) -> Generator[None, object, torch.Tensor]:
    """`runner.prompt_logits` as steps, as `prefill_steps`."""
    layers = getattr(runner, "prompt_logits_layers", None)
    if layers is not None:
        return layers(sequence, start)
    return _whole(partial(runner.prompt_logits, sequence, start))


def _whole(run: Callable[[], T]) -> Generator[None, object, T]:
    return run()
    yield  # a generator with no pause


def make_runner(
    model,
    device: torch.device,
    dtype: torch.dtype,
    q4_weights: bool = False,
    fixed_kernels: bool = False,
) -> Runner:
    """The fastest faithful runner for this model on this device (with `fixed_kernels`, plain ones
    whose rounding does not depend on the CPU kind: engine/numerics.py)."""
    runner_type = LeanRunner if LeanRunner.supports(model) else HFRunner
    if device.type != "cpu":
        return runner_type(model, device, dtype, None, None)
    body = KernelPlan(device, dtype, int4=q4_weights, fixed=fixed_kernels)
    head = KernelPlan(device, torch.float32, int4=False, fixed=fixed_kernels)
    return runner_type(model, device, dtype, body, head)


def mlp_norms(runner: Runner) -> list[torch.nn.Module] | None:
    """Each block's norm in front of its MLP where the runner knows them (the lean runner's
    layout), for the residual editor's MLP-input taps; None elsewhere."""
    if not isinstance(runner, LeanRunner):
        return None
    return [block.mlp_norm for block in runner.layout.blocks]
