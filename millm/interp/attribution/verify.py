"""Checking a graph against the served model: ablate its top features, compare with the prediction.

A feature node's write is a·W_dec[f] at one position (after its block: an SAE on that residual, or a
transcoder's MLP output, which the block adds there; a cross-layer transcoder's feature writes
a·W_dec[f, k] after each block from its own on, and all of it is removed). Removing it through a
steering operation (a ResidualEdit operation at that point, that position only) on the served runner
and re-reading the target measures what the node does; the graph predicts minus the node's total
effect on the target (its direct edge plus every path through expanded features, signed). As
circuit-tracer's interventions do, the measuring passes hold each residual SAE's error at its clean
value (another operation: the residual becomes the SAE's reconstruction of it plus that error), so
downstream features respond to the ablation while what they miss stays what the graph's error nodes
hold. The errors are the served model's own: the clean pass records them (its operation changes
nothing), since its kernels and precision are not the graph's. The graph passes when the predictions
and measurements correlate (Pearson r at least PASS_CORRELATION over the checked nodes); a graph of
fewer than 3 checked nodes has no correlation and passes when every sign agrees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit, combined
from millm.interp.attribution.graph import Graph, Target
from millm.interp.attribution.pruning import influence

PASS_CORRELATION = 0.7


@dataclass(frozen=True)
class NodeAblation:
    """One feature node: the target's change its ablation should bring, and the change it brings."""

    node: int
    predicted: float
    measured: float


@dataclass(frozen=True)
class AblationCheck:
    """The checked nodes, the served model's own target value and the correlation's verdict."""

    checks: list[NodeAblation]
    served_value: float
    correlation: float | None
    passed: bool


def total_effects(graph: Graph) -> torch.Tensor:
    """Every node's signed total effect on the target through the graph's (unpruned) edges."""
    weights = torch.zeros(graph.adjacency.shape[0], dtype=graph.adjacency.dtype)
    weights[-1] = 1.0
    return influence(graph.adjacency, weights)


def held_errors(graph: Graph) -> ResidualEdit:
    """Operations holding every residual source's error at the value the first pass they run in
    (the clean one) records."""
    operations = [
        (source.layer, _held(source.sae, len(graph.prompt)))
        for source in graph.sources
        if source.site == "resid"
    ]
    return ResidualEdit((), tuple(operations))


def _held(sae, positions: int):
    recorded: list[torch.Tensor] = []

    def operation(residual: torch.Tensor) -> torch.Tensor:
        # The prompt's positions; a pass may run one more, which nothing reads back.
        x = residual[:positions].to(sae.W_enc.dtype)
        rebuilt = sae.decode(sae.encode(x), x)
        if not recorded:
            recorded.append(x - rebuilt)
            return residual
        out = residual.clone()
        out[:positions] = (rebuilt + recorded[0]).to(out.dtype)
        return out

    return operation


def served_logits(lm: LoadedModel, prompt: list[int], edit: ResidualEdit | None) -> torch.Tensor:
    """The served model's (its own runner and kernels) next-token logits `[V]` after `prompt`,
    under `edit`."""
    lm.residual.install(lm.residual.stack([edit]))
    try:
        return lm.runner.prompt_logits([*prompt, 0], len(prompt))[-1]
    finally:
        lm.residual.clear()


def served_value(
    lm: LoadedModel, prompt: list[int], target: Target, edit: ResidualEdit | None
) -> float:
    """The target's value in the served model, under `edit`."""
    return float(target.value(served_logits(lm, prompt, edit).double()))


def removal(position: int, vector: torch.Tensor):
    """A steering operation taking `vector` out of the residual at one position."""

    def operation(residual: torch.Tensor) -> torch.Tensor:
        out = residual.clone()
        out[position] -= vector.to(device=out.device, dtype=out.dtype)
        return out

    return operation


def verify(
    lm: LoadedModel, graph: Graph, nodes: list[int], edit: ResidualEdit | None
) -> AblationCheck:
    """Ablate each of `nodes` (feature indices of the graph) alone on the served model."""
    effects = total_effects(graph)
    edit = combined(edit, held_errors(graph))
    clean = served_value(lm, graph.prompt, graph.target, edit)
    checks = []
    for node in nodes:
        feature = graph.features[node]
        source = graph.sources[feature.source]
        # Sources carry no run-time normalisation (the service refuses them), so the write is
        # a·W_dec.
        index = torch.tensor([feature.index], device=source.sae.W_dec.device)
        vectors = feature.activation * source.sae.writes(index)[0].double()  # [reach, d]
        removals = tuple(
            (source.layer + k, removal(feature.position, vector))
            for k, vector in enumerate(vectors)
        )
        ablation = ResidualEdit((), removals)
        measured = served_value(lm, graph.prompt, graph.target, combined(edit, ablation)) - clean
        checks.append(NodeAblation(node, -float(effects[node]), measured))
    return AblationCheck(checks, clean, *verdict(checks))


def verdict(checks: list[NodeAblation]) -> tuple[float | None, bool]:
    """(Pearson r of predicted against measured, or None under 3 nodes; whether it passes)."""
    if len(checks) < 3:
        agree = all((c.predicted > 0) == (c.measured > 0) for c in checks)
        return None, agree
    predicted = torch.tensor([c.predicted for c in checks], dtype=torch.float64)
    measured = torch.tensor([c.measured for c in checks], dtype=torch.float64)
    if predicted.std() == 0 or measured.std() == 0:
        return None, False
    r = float(torch.corrcoef(torch.stack([predicted, measured]))[0, 1])
    return r, r >= PASS_CORRELATION
