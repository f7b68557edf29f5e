"""What a kept graph becomes: a steering profile of its chosen features, and a graph read back
from circuit-tracer's JSON (made by circuit-tracer, Neuronpedia or millm's own export)."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Callable

from millm.errors import InvalidRequest
from millm.lab.attribution.protocol import (
    AttributionGraph,
    GraphEdge,
    GraphNode,
    ImportedGraph,
    ImportedNode,
    SubgraphCircuit,
    SubgraphProfile,
    TargetRead,
)
from millm.lab.discovery.protocol import SteeringUsed, TokenRead

KINDS = {"embedding": "token", "logit": "target", "mlp reconstruction error": "error"}
OUTPUT = re.compile(r'^Output "(.*)" \(p=')
MAX_CIRCUIT_EDGES = 200  # a circuit document holds at most this many edges


def chosen_features(graph: AttributionGraph, chosen: list[str]) -> list[GraphNode]:
    """The graph's feature nodes named in `chosen`; 400 naming `nodes[i]` for a node the graph
    lacks or one that is not a feature."""
    nodes = {n.id: n for n in graph.nodes}
    found = []
    for i, node_id in enumerate(chosen):
        node = nodes.get(node_id)
        if node is None:
            raise InvalidRequest(f"graph {graph.id} has no node {node_id!r}", param=f"nodes[{i}]")
        if node.kind != "feature" or node.sae_id is None or node.feature is None:
            raise InvalidRequest(
                f"node {node_id!r} is a {node.kind} node; only feature nodes steer",
                param=f"nodes[{i}]",
            )
        found.append(node)
    return found


# A chosen feature node and its place in `nodes` -> the id of the SAE that steers its feature
# (a set's transcoder: its block's file, registered as an SAE on the way).
SAEOf = Callable[[GraphNode, int], str]


def _described(graph: AttributionGraph, count: int, given: str | None, what: str) -> str:
    if given is not None:
        return given
    target = "".join(graph.target.tokens)
    return f"{what} {count} node(s) of attribution graph {graph.id} ({target!r})"


def profile_document(graph: AttributionGraph, body: SubgraphProfile, sae_of: SAEOf) -> dict:
    """A millm.profile (version 2) steering the chosen feature nodes' features."""
    by_sae: dict[str, dict[int, dict[str, object]]] = {}
    for i, node in enumerate(chosen_features(graph, body.nodes)):
        entry: dict[str, object] = {"index": node.feature, "op": body.op}
        if body.op == "add":
            entry["strength"] = body.strength
        by_sae.setdefault(sae_of(node, i), {})[int(node.feature or 0)] = entry
    return {
        "kind": "millm.profile",
        "version": 2,
        "name": body.name,
        "description": _described(
            graph, len(body.nodes), body.description, f"{body.op} the features of"
        ),
        "steering": [
            {"sae_id": sae, "features": list(features.values())} for sae, features in by_sae.items()
        ],
    }


def circuit_document(graph: AttributionGraph, body: SubgraphCircuit, sae_of: SAEOf) -> dict:
    """A mistudio.circuit-definition of the chosen feature nodes: one feature_ref member per
    feature (at `strength`), the graph's edges between them at rung 1 (attribution-supported)."""
    nodes = chosen_features(graph, body.nodes)
    members: dict[tuple[int, int], dict] = {}
    saes: dict[int, dict] = {}
    for i, node in enumerate(nodes):
        feature = int(node.feature or 0)
        members[(node.layer, feature)] = {
            "layer": node.layer,
            "member_kind": "feature_ref",
            "feature": {
                "feature_idx": feature,
                "strength": body.strength,
                "sign": 1,
                **({"label": node.label} if node.label else {}),
            },
        }
        saes[node.layer] = {
            "mistudio_sae_id": sae_of(node, i),
            "layer": node.layer,
            "hook_type": "resid_post" if node.site == "resid" else "mlp",
        }
    chosen = {n.id: n for n in nodes}
    edges = [
        {
            "up": {
                "layer": chosen[e.source].layer,
                "feature_idx": chosen[e.source].feature,
                "kind": "feature",
            },
            "down": {
                "layer": chosen[e.target].layer,
                "feature_idx": chosen[e.target].feature,
                "kind": "feature",
            },
            "type": "computed",
            "rung": 1,
            "attribution": {"method": "raw", "score": e.weight},
        }
        for e in graph.edges
        if e.source in chosen and e.target in chosen
    ][:MAX_CIRCUIT_EDGES]
    return {
        "kind": "mistudio.circuit-definition",
        "schema_version": "1",
        "name": body.name,
        "narrative": _described(graph, len(body.nodes), body.narrative, "the features of"),
        "model": {"hf_id": graph.model},
        "saes": list(saes.values()),
        "members": list(members.values()),
        "edges": edges,
        "provenance": {"source_note": f"millm attribution graph {graph.id}"},
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
    counts = Counter(n.id for n in nodes)
    ids = set(counts)
    if len(ids) < len(nodes):
        twice = sorted(i for i, n in counts.items() if n > 1)
        raise InvalidRequest(
            f"node ids {twice[:5]} name more than one node, so the links are ambiguous",
            param="nodes",
        )
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
