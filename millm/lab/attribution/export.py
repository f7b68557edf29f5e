"""A graph in the JSON that circuit-tracer writes and Neuronpedia's graph viewer reads
(circuit_tracer/frontend/graph_models.py: metadata, qParams, nodes, links)."""

from __future__ import annotations

from typing import Any

from millm.lab.attribution.protocol import AttributionGraph, GraphNode

FEATURE_TYPES = {
    # the viewer's name for a feature node, whatever its source
    "feature": "cross layer transcoder",
    "error": "mlp reconstruction error",
    "token": "embedding",
    "target": "logit",
}


def cantor(x: int, y: int) -> int:
    """circuit-tracer's feature number: the Cantor pairing of (layer, index)."""
    return (x + y) * (x + y + 1) // 2 + y


def _node(node: GraphNode, graph: AttributionGraph) -> dict[str, Any]:
    kind = node.kind
    if kind == "feature":
        number, js = cantor(max(node.layer, 0), node.feature or 0), f"{node.layer}_{node.feature}-0"
    elif kind == "error":
        number, js = -1, f"{node.layer}_{node.position}-0"
    elif kind == "token":
        number, js = node.position, f"E_{node.token_id}-{node.position}"
    else:
        number, js = node.token_id or 0, f"L_{node.token_id}-{node.position}"
    target = kind == "target"
    return {
        "node_id": node.id,
        "feature": number,
        "layer": "E" if kind == "token" else str(node.layer + 1 if target else node.layer),
        "ctx_idx": node.position,
        "feature_type": FEATURE_TYPES[kind],
        "token_prob": graph.target.probability if target else 0.0,
        "is_target_logit": target,
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "jsNodeId": js,
        "clerp": (
            f'Output "{node.token}" (p={graph.target.probability:.3f})'
            if target
            else node.label or ""
        ),
        "influence": node.influence,
        "activation": node.activation,
    }


def circuit_tracer_json(graph: AttributionGraph) -> dict[str, Any]:
    """The graph as circuit-tracer's create_graph_files writes it (slug: the graph's id)."""
    return {
        "metadata": {
            "slug": graph.id,
            "scan": f"millm-{graph.model}",
            "transcoder_list": [s.sae_id for s in graph.sources],
            "prompt_tokens": [t.token for t in graph.tokens],
            "prompt": "".join(t.token for t in graph.tokens),
            "node_threshold": graph.node_threshold,
            "schema_version": 1,
        },
        "qParams": {
            "pinnedIds": [],
            "supernodes": [],
            "linkType": "both",
            "clickedId": "",
            "sg_pos": "",
        },
        "nodes": [_node(n, graph) for n in graph.nodes],
        "links": [
            {"source": e.source, "target": e.target, "weight": e.weight} for e in graph.edges
        ],
    }
