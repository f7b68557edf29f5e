"""Choosing how a loaded model runs: which runner, which kernels, which precision where.

On the CPU the weights arrive in float32 and the kernels are built from them: float32 keeps
every matmul in float32; bfloat16 runs the layers in bfloat16 but keeps the output layer in
float32 (it decides the token, and a bf16 head alone cost half of the agreement with float32
greedy tokens in our measurements); a GGUF Q4_1 file's linears run on the int4 kernel over the
file's own codes. On CUDA the model runs as loaded.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from millm.engine.kernels import KernelPlan
from millm.engine.runner_hf import HFRunner
from millm.engine.runner_lean import LeanRunner


class Runner(Protocol):
    """What the engine asks of a runner (LeanRunner, HFRunner, LlamaCppRunner). A batch is the runner's own
    (LeanBatch, HFBatch) and only ever goes back to the runner that made it, hence Any."""

    name: str
    kernels: str
    mergeable: bool

    def prefill(self, prompts: list[list[int]], capacity: int) -> tuple[Any, torch.Tensor]: ...

    def step(self, batch: Any, next_ids: torch.Tensor) -> torch.Tensor: ...

    def select_rows(self, batch: Any, indices: list[int]) -> None: ...

    def merge(self, a: Any, b: Any, room: int) -> Any: ...

    def hidden_states(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def prompt_logits(self, sequence: list[int], start: int) -> torch.Tensor: ...


def make_runner(model, device: torch.device, dtype: torch.dtype, q4_weights: bool = False) -> Runner:
    """The fastest faithful runner for this model on this device."""
    runner_type = LeanRunner if LeanRunner.supports(model) else HFRunner
    if device.type != "cpu":
        return runner_type(model, device, dtype, None, None)
    body = KernelPlan(device, dtype, int4=q4_weights)
    head = KernelPlan(device, torch.float32, int4=False)
    return runner_type(model, device, dtype, body, head)
