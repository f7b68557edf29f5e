"""Influence and pruning of an attribution graph, as circuit-tracer defines them.

The adjacency matrix holds direct effects, rows = targets, columns = sources. Influence is taken
on its row-normalised absolute values: a node's influence on the output is the sum over paths of
the products of normalised edge shares (A + A² + ..., which ends because the graph is acyclic).
Pruning keeps the nodes that carry `node_threshold` of the total influence and then the edges
that carry `edge_threshold` of it, and drops any feature or error node left without an edge out
(or, for a feature, in). The replacement score is the share of the tokens' influence on the
output that does not pass through error nodes; completeness is the influence-weighted share of
each node's inputs that are not errors. circuit-tracer itself cannot be imported beside millm
(it pins transformers below 5), so these few functions follow its graph.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_DEPTH = 10_000  # an acyclic graph's influence settles in at most depth steps


def normalised(matrix: torch.Tensor) -> torch.Tensor:
    """|A| with each row scaled to sum to 1 (rows of zeros stay zero)."""
    absolute = matrix.abs()
    return absolute / absolute.sum(dim=1, keepdim=True).clamp(min=1e-10)


def _paths(rows: torch.Tensor, row_nodes: torch.Tensor | None, seed: torch.Tensor) -> torch.Tensor:
    """seed @ (A + A² + ...) over the known rows of an acyclic A: `rows` `[R, N]` are the inputs
    of nodes `row_nodes` (None: every node, R = N), `seed` `[R]` what flows out of each row."""
    total = torch.zeros(rows.shape[1], dtype=rows.dtype)
    flowing = seed
    for _ in range(MAX_DEPTH):
        if not flowing.any():
            return total
        step = flowing @ rows
        total += step
        flowing = step if row_nodes is None else step[row_nodes]
    raise RuntimeError("influence did not settle: the graph has a cycle")


def influence(matrix: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """weights @ (A + A² + ...) for an acyclic A (rows: targets)."""
    return _paths(matrix, None, weights)


def partial_influence(
    rows: torch.Tensor, row_nodes: torch.Tensor, seed: torch.Tensor
) -> torch.Tensor:
    """Influence on the output of every node when only some nodes' input rows are known:
    `rows` `[R, N]` are the input edges of nodes `row_nodes` `[R]`, `seed` `[R]` their own
    output weight (1 for the target's row)."""
    return _paths(normalised(rows), row_nodes, seed)


def threshold_of(scores: torch.Tensor, keep: float) -> float:
    """The score above which the highest scores add up to `keep` of the total."""
    ordered = torch.sort(scores.flatten(), descending=True).values
    total = ordered.sum()
    if total <= 0:
        return float("inf")
    cumulative = torch.cumsum(ordered, dim=0) / total
    index = min(
        int(torch.searchsorted(cumulative, torch.tensor(keep, dtype=cumulative.dtype))),
        len(ordered) - 1,
    )
    return float(ordered[index])


@dataclass(frozen=True)
class Pruned:
    """Which nodes and edges survive, each node's influence and its cumulative influence rank."""

    nodes: torch.Tensor  # [N] bool
    edges: torch.Tensor  # [N, N] bool, rows targets
    influence: torch.Tensor  # [N]
    # [N]: the share of total influence of the nodes at least this influential
    cumulative: torch.Tensor


def prune(
    adjacency: torch.Tensor,
    weights: torch.Tensor,
    features: int,
    always: torch.Tensor,
    node_threshold: float,
    edge_threshold: float,
) -> Pruned:
    """circuit-tracer's prune_graph: `weights` [N] is each output node's weight, `features` the
    number of feature nodes (they come first), `always` [N] the nodes kept whatever their influence
    (the tokens and the output)."""
    node_influence = influence(normalised(adjacency), weights)
    keep = (node_influence >= threshold_of(node_influence, node_threshold)) | always
    matrix = adjacency.clone()
    matrix[~keep] = 0
    matrix[:, ~keep] = 0
    shares = normalised(matrix)
    edge_scores = shares * (influence(shares, weights) + weights)[:, None]
    edges = edge_scores >= threshold_of(edge_scores, edge_threshold)
    edges &= matrix != 0
    prunable = ~always
    while True:
        before = keep.clone()
        edges[~keep] = False
        edges[:, ~keep] = False
        keep[prunable] &= edges[:, prunable].any(0)  # a feature or error needs an edge out
        keep[:features] &= edges[:features].any(1)  # a feature needs an edge in
        if torch.equal(keep, before):
            break
    ordered, order = torch.sort(node_influence, descending=True)
    cumulative = torch.zeros_like(node_influence)
    total = ordered.sum().clamp(min=1e-10)
    cumulative[order] = torch.cumsum(ordered, dim=0) / total
    return Pruned(keep, edges, node_influence, cumulative)


def scores(
    adjacency: torch.Tensor, weights: torch.Tensor, errors: slice, tokens: slice
) -> tuple[float, float]:
    """(replacement, completeness): how much of the computation flows through features and tokens
    rather than error nodes, each 0..1 (1: the features explain everything)."""
    shares = normalised(adjacency)
    node_influence = influence(shares, weights)
    token_influence = node_influence[tokens].sum()
    error_influence = node_influence[errors].sum()
    replacement = token_influence / (token_influence + error_influence).clamp(min=1e-10)
    not_error = 1 - shares[:, errors].sum(dim=-1)
    output_influence = node_influence + weights
    completeness = (not_error * output_influence).sum() / output_influence.sum()
    return float(replacement), float(completeness)
