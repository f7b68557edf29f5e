"""Integrated gradients for an attribution-patching graph (Sundararajan et al. 2017, as Marks et
al.'s sparse feature circuits use them for SAE features).

Gradient × activation is the first-order estimate of removing a node: far from the prompt's
operating point (a feature's whole write taken away) the model's own non-linearity makes it
wrong, sometimes in sign. Integrated gradients average the gradient along the path from the
node's absence to its presence instead. Here the path is per source's injection point, as Marks
et al. take it per layer: every node that writes at a point (the features landing there and its
error node) writes α of its write, for α at the midpoints of `steps` equal intervals of [0, 1],
while everything else the pass holds (the other sources' writes, as in the graph's own pass)
stays; the source's b_dec is the path's start. A node's edge is its write dotted with that mean
gradient, so the edges from one point's nodes to a target sum to the target's change when they
are removed (completeness), up to the quadrature's error.

The tokens keep the pass's own gradient: their path would start from a zero residual, where
the first norm's epsilon puts nearly all of the change into a sliver of the path no few-step
rule samples.

Each point costs `steps` forward passes and batched backward passes per batch of rows; a point
after every seeded output is skipped (nothing there reaches them directly).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from millm.engine.residual import ResidualEdit
from millm.interp.attribution.replacement import FrozenPass, ReplacementModel, Source, Trace

MAX_STEPS = 32
# The output a seed belongs to: -1 the target, i >= 0 source i's pre-activations.
Output = Callable[[Trace, int], torch.Tensor]


def point_totals(
    trace: Trace,
    positions: list[torch.Tensor],
    writes: list[torch.Tensor],
    lands: list[list[int]],
) -> list[torch.Tensor | None]:
    """What every node writing at each injection point writes there together `[T, d]`: point
    i + 1 source i's error nodes and the features landing there (point 0, the tokens', None:
    not integrated)."""
    totals: list[torch.Tensor | None] = [None]
    totals += [s.errors.detach().clone() for s in trace.sources]
    for index, landed in enumerate(lands):
        for k, place in enumerate(landed):
            total = totals[place + 1]
            assert total is not None
            total.index_add_(0, positions[index], writes[index][:, k].detach())
    return totals


def path_gradients(
    model: ReplacementModel,
    prompt: list[int],
    sources: list[Source],
    edit: ResidualEdit | None,
    held: FrozenPass,
    totals: list[torch.Tensor | None],
    seeds: dict[int, torch.Tensor],
    output: Output,
    steps: int,
) -> list[torch.Tensor | None]:
    """Per injection point, the seeded outputs' gradient there `[n, T, d]` averaged over the
    point's path (None where no seeded output lies after it, or the point has no total);
    `held` replays the graph's pass."""
    gradients: list[torch.Tensor | None] = []
    for point, total in enumerate(totals):
        # Source j reads after the points of the tokens and of sources 0..j-1 only.
        wanted = {index: seed for index, seed in seeds.items() if index < 0 or index >= point}
        if total is None or not wanted:
            gradients.append(None)
            continue
        mean: torch.Tensor | None = None
        for step in range(steps):
            alpha = (step + 0.5) / steps
            shifts = {point: -(1.0 - alpha) * total}
            trace = model.trace(prompt, 1, sources, edit, held=held.replaying(), shifts=shifts)
            place = trace.sources[point - 1].z
            (grad,) = torch.autograd.grad(
                [output(trace, index) for index in wanted],
                [place],
                grad_outputs=list(wanted.values()),
                allow_unused=True,
                is_grads_batched=True,
            )
            if grad is not None:
                grad = grad[:, 0].detach() / steps
                mean = grad if mean is None else mean + grad
        gradients.append(mean)
    return gradients
