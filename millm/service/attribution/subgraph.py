"""What a kept graph becomes: a steering profile of its chosen features, and a graph read back
from circuit-tracer's JSON (made by circuit-tracer, Neuronpedia or millm's own export)."""

from __future__ import annotations

import re
import uuid

from millm.errors import InvalidRequest
from millm.protocol.attribution import (
    AttributionGraph,
    GraphEdge,
    GraphNode,
    ImportedGraph,
    ImportedNode,
    SubgraphProfile,
    TargetRead,
)
from millm.protocol.discovery import SteeringUsed, TokenRead

KINDS = {"embedding": "token", "logit": "target", "mlp reconstruction error": "error"}
OUTPUT = re.compile(r'^Output "(.*)" \(p=')


def profile_document(graph: AttributionGraph, body: SubgraphProfile) -> dict:
    """A millm.profile (version 2) steering the chosen feature nodes' features; 400 naming
    `nodes[i]` for a node the graph lacks or one that is not a feature."""
    nodes = {n.id: n for n in graph.nodes}
    by_sae: dict[str, dict[int, dict[str, object]]] = {}
    for i, node_id in enumerate(body.nodes):
        node = nodes.get(node_id)
        if node is None:
            raise InvalidRequest(f"graph {graph.id} has no node {node_id!r}", param=f"nodes[{i}]")
        if node.kind != "feature" or node.sae_id is None or node.feature is None:
            raise InvalidRequest(
                f"node {node_id!r} is a {node.kind} node; a profile steers feature nodes",
                param=f"nodes[{i}]",
            )
        entry: dict[str, object] = {"index": node.feature, "op": body.op}
        if body.op == "add":
            entry["strength"] = body.strength
        by_sae.setdefault(node.sae_id, {})[node.feature] = entry
    target = "".join(graph.target.tokens)
    description = body.description
    if description is None:
        description = f"{body.op} the features of {len(body.nodes)} node(s) of attribution graph {graph.id} ({target!r})"
    return {
        "kind": "millm.profile",
        "version": 2,
        "name": body.name,
        "description": description,
        "steering": [
            {"sae_id": sae, "features": list(features.values())} for sae, features in by_sae.items()
        ],
    }


def _numbers(node: ImportedNode, param: str) -> tuple[int, int]:
    """(layer, index) of a feature node from its id `layer_index_position`."""
    parts = node.node_id.split("_")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise InvalidRequest(
            f"feature node id {node.node_id!r} is not layer_feature_position", param=param
        ) from None


def imported_node(node: ImportedNode, tokens: list[str], param: str) -> GraphNode:
    """One circuit-tracer node as millm's."""
    kind = KINDS.get(node.feature_type, "feature")
    common = {"id": node.node_id, "position": node.ctx_idx, "influence": node.influence or 0.0}
    if kind == "feature":
        layer, index = _numbers(node, param)
        return GraphNode(
            kind="feature",
            layer=layer,
            feature=index,
            label=node.clerp or None,
            activation=node.activation,
            **common,
        )
    if kind == "error":
        return GraphNode(kind="error", layer=int(node.layer), **common)
    if kind == "token":
        token_id = int(node.node_id.split("_")[1]) if node.node_id.startswith("E_") else -1
        token = tokens[node.ctx_idx] if node.ctx_idx < len(tokens) else ""
        return GraphNode(kind="token", layer=-1, token_id=token_id, token=token, **common)
    said = OUTPUT.match(node.clerp)
    return GraphNode(
        kind="target",
        layer=int(node.layer) - 1,
        token_id=node.feature,
        token=said.group(1) if said else "",
        **common,
    )


def imported_graph(document: ImportedGraph) -> AttributionGraph:
    """A kept graph from circuit-tracer's JSON (400 naming the node that cannot be read)."""
    tokens = document.metadata.prompt_tokens
    nodes = [imported_node(node, tokens, f"nodes[{i}]") for i, node in enumerate(document.nodes)]
    ids = {n.id for n in nodes}
    for i, link in enumerate(document.links):
        for end in ("source", "target"):
            if getattr(link, end) not in ids:
                raise InvalidRequest(
                    f"links[{i}].{end} names {getattr(link, end)!r}, which is not a node",
                    param=f"links[{i}].{end}",
                )
    targets = [n for n in document.nodes if n.feature_type == "logit"]
    main = next((n for n in targets if n.is_target_logit), targets[0] if targets else None)
    if main is None:
        raise InvalidRequest("the graph has no logit node", param="nodes")
    target = next(n for n in nodes if n.id == main.node_id)
    by_position = {
        n.position: n.token_id for n in nodes if n.kind == "token" and n.token_id is not None
    }
    return AttributionGraph(
        id=f"graph-{uuid.uuid4().hex[:12]}",
        model=document.metadata.scan or "",
        method="imported",
        steered=False,
        steering=SteeringUsed(kind="none"),
        tokens=[
            TokenRead(position=p, token_id=by_position.get(p, -1), token=t)
            for p, t in enumerate(tokens)
        ],
        target=TargetRead(
            token_ids=[target.token_id or 0],
            tokens=[target.token or ""],
            coefficients=[1.0],
            value=0.0,
            probability=main.token_prob,
        ),
        sources=[],
        expanded_features=sum(n.kind == "feature" for n in nodes),
        nodes=nodes,
        edges=[
            GraphEdge(source=link.source, target=link.target, weight=link.weight)
            for link in document.links
        ],
        replacement_score=None,
        completeness_score=None,
        node_threshold=document.metadata.node_threshold or 0.0,
        edge_threshold=0.0,
        verification=None,
        seconds=0.0,
    )
