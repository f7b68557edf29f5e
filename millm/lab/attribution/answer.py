"""A graph said as the API answers it: node ids as circuit-tracer writes them, token strings,
feature labels, the strongest edges of the pruned graph, and the check's verdict."""

from __future__ import annotations

import torch

from millm.engine.loader import LoadedModel
from millm.interp.attribution.graph import Graph
from millm.interp.attribution.verify import PASS_CORRELATION, AblationCheck
from millm.lab.attribution.parts import AttributionParts
from millm.lab.attribution.protocol import (
    AttributionGraph,
    AttributionRequest,
    GraphEdge,
    GraphNode,
    NodeCheck,
    SourceRead,
    TargetRead,
    Verification,
)
from millm.lab.discovery.inputs import ReadSteering, label_of
from millm.lab.discovery.inspection import token_strings
from millm.lab.discovery.protocol import SteeringUsed, TokenRead


def node_ids(graph: Graph, blocks: int) -> list[str]:
    """Every node's id, as circuit-tracer names nodes: layer_feature_position, E_token_position,
    and (blocks + 1)_token_position for the target; but err_layer_position for an error node,
    where circuit-tracer writes 0_layer_position, which is also the id of block 0's feature
    `layer` at that position (a clash the tiny model's graphs meet)."""
    ids = []
    for node in range(graph.adjacency.shape[0]):
        kind, source, position = graph.kind(node)
        if kind == "feature":
            feature = graph.features[node]
            ids.append(f"{graph.sources[source].layer}_{feature.index}_{position}")
        elif kind == "error":
            ids.append(f"err_{graph.sources[source].layer}_{position}")
        elif kind == "token":
            ids.append(f"E_{graph.prompt[position]}_{position}")
        else:
            ids.append(f"{blocks + 1}_{graph.target.ids[0]}_{position}")
    return ids


def graph_answer(
    state: AttributionParts,
    lm: LoadedModel,
    graph: Graph,
    checked: AblationCheck | None,
    body: AttributionRequest,
    steered: ReadSteering,
    graph_id: str,
    seconds: float,
) -> AttributionGraph:
    """The response (blocking: decoding and the labels, which may come from the store)."""
    blocks = int(lm.config.num_hidden_layers)
    ids = node_ids(graph, blocks)
    labels = {
        s.name: state.saes.labels(s.name) if s.site == "resid" else state.transcoders.labels(s.name)
        for s in graph.sources
    }
    said = dict(zip(graph.prompt, token_strings(lm, graph.prompt), strict=True))
    said.update(zip(graph.target.ids, token_strings(lm, list(graph.target.ids)), strict=True))
    pruned = graph.pruned
    weights = graph.adjacency * pruned.edges
    order = torch.argsort(weights.abs().flatten(), descending=True)[: body.max_edges]
    order = order[weights.flatten()[order] != 0]
    size = graph.adjacency.shape[0]
    edges = [
        GraphEdge(
            source=ids[int(i) % size],
            target=ids[int(i) // size],
            weight=float(weights.flatten()[i]),
        )
        for i in order
    ]
    linked = {e.source for e in edges} | {e.target for e in edges}
    nodes = []
    for node in torch.nonzero(pruned.nodes)[:, 0].tolist():
        kind, source, position = graph.kind(node)
        if kind in ("feature", "error") and ids[node] not in linked:
            continue
        nodes.append(_node(graph, node, ids[node], kind, source, position, blocks, labels, said))
    return AttributionGraph(
        id=graph_id,
        model=lm.name,
        method=graph.method,
        steered=steered.edit is not None,
        steering=SteeringUsed(kind=steered.kind, params=steered.params),
        tokens=[
            TokenRead(position=p, token_id=t, token=said[t]) for p, t in enumerate(graph.prompt)
        ],
        target=TargetRead(
            token_ids=list(graph.target.ids),
            tokens=[said[t] for t in graph.target.ids],
            coefficients=list(graph.target.coefficients),
            value=round(graph.target_value, 6),
            probability=round(graph.probability, 6),
        ),
        sources=[
            SourceRead(
                sae_id=s.name,
                layer=s.layer,
                site=s.site,
                active_features=sum(f.source == i for f in graph.features),
            )
            for i, s in enumerate(graph.sources)
        ],
        expanded_features=len(graph.features),
        nodes=nodes,
        edges=edges,
        replacement_score=round(graph.replacement_score, 6),
        completeness_score=round(graph.completeness_score, 6),
        node_threshold=body.node_threshold,
        edge_threshold=body.edge_threshold,
        verification=None if checked is None else _verification(graph, checked, ids, labels),
        seconds=round(seconds, 3),
    )


def _node(graph, node, node_id, kind, source, position, blocks, labels, said) -> GraphNode:
    influence = round(float(graph.pruned.cumulative[node]), 6)
    if kind == "feature":
        feature = graph.features[node]
        name = graph.sources[source].name
        return GraphNode(
            id=node_id,
            kind="feature",
            layer=graph.sources[source].layer,
            position=position,
            sae_id=name,
            site=graph.sources[source].site,
            feature=feature.index,
            label=label_of(labels[name], feature.index),
            activation=round(feature.activation, 6),
            influence=influence,
        )
    if kind == "error":
        return GraphNode(
            id=node_id,
            kind="error",
            layer=graph.sources[source].layer,
            position=position,
            sae_id=graph.sources[source].name,
            site=graph.sources[source].site,
            influence=influence,
        )
    token = graph.prompt[position] if kind == "token" else graph.target.ids[0]
    return GraphNode(
        id=node_id,
        kind=kind,
        layer=-1 if kind == "token" else blocks,
        position=position,
        token_id=token,
        token=said[token],
        influence=influence,
    )


def _verification(graph: Graph, checked: AblationCheck, ids: list[str], labels) -> Verification:
    return Verification(
        served_value=round(checked.served_value, 6),
        nodes=[
            NodeCheck(
                node=ids[c.node],
                label=label_of(
                    labels[graph.sources[graph.features[c.node].source].name],
                    graph.features[c.node].index,
                ),
                predicted=round(c.predicted, 6),
                measured=round(c.measured, 6),
            )
            for c in checked.checks
        ],
        correlation=None if checked.correlation is None else round(checked.correlation, 4),
        passed=checked.passed,
        pass_correlation=PASS_CORRELATION,
    )
