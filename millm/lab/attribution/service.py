"""What attribution offers the routes: compute a graph, read a recent one, export it, import one,
make a profile or a miStudio circuit of its chosen features."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from millm.kernel.runtime.jobs import JobHandle, JobView, on_loop
from millm.kernel.runtime.threads import in_passing_thread
from millm.lab.attribution.book import GraphBook
from millm.lab.attribution.export import circuit_tracer_json
from millm.lab.attribution.parts import AttributionParts
from millm.lab.attribution.protocol import (
    AttributionGraph,
    AttributionRequest,
    GraphNode,
    ImportedGraph,
    SubgraphCircuit,
    SubgraphProfile,
)
from millm.lab.attribution.run import attribute, prepare, trace
from millm.lab.attribution.subgraph import circuit_document, imported_graph, profile_document
from millm.wording import counted


class Attribution:
    """The attribution routes' one way in; keeps the last graphs."""

    def __init__(self, state: AttributionParts):
        self.state = state
        self.book = GraphBook()
        self.transcoders = state.transcoders

    async def attribute(self, body: AttributionRequest) -> AttributionGraph:
        """POST /api/attribution: compute, check and keep a graph."""
        graph = await attribute(self.state, body, self.transcoders)
        self.book.add(graph)
        return graph

    async def start_job(self, body: AttributionRequest) -> JobView:
        """POST /api/attribution/jobs: the same graph as a job (checked now, traced on the job's
        time, kept like any graph); its result names the graph and sums it up."""
        prepared = await prepare(self.state, body, self.transcoders)

        async def work(handle: JobHandle) -> dict:
            with self.state.switch.request_scope():  # the job's own leases, as a request's
                graph = await trace(self.state, prepared, handle)
            self.book.add(graph)
            check = graph.verification
            return {
                "graph_id": graph.id,
                "method": graph.method,
                "target": graph.target.tokens,
                "probability": graph.target.probability,
                "expanded_features": graph.expanded_features,
                "nodes": len(graph.nodes),
                "edges": len(graph.edges),
                "check_passed": None if check is None else check.passed,
                "check_correlation": None if check is None else check.correlation,
                "seconds": graph.seconds,
            }

        description = (
            f"attribution graph of {counted(len(prepared.prompt), 'token')}, up to "
            f"{counted(prepared.budget.max_feature_nodes, 'feature')}"
        )
        return self.state.jobs.start(
            "attribution",
            description,
            prepared.budget.max_feature_nodes,
            "features",
            on_loop(asyncio.get_running_loop(), work),
        )

    def graph(self, graph_id: str) -> AttributionGraph:
        """A kept graph (404 graph_not_found)."""
        return self.book.get(graph_id)

    def export(self, graph_id: str) -> dict[str, Any]:
        """A kept graph in circuit-tracer's JSON."""
        return circuit_tracer_json(self.book.get(graph_id))

    def import_graph(self, document: ImportedGraph) -> AttributionGraph:
        """Keep a graph read from circuit-tracer's JSON."""
        graph = imported_graph(document)
        self.book.add(graph)
        return graph

    def profile(self, graph_id: str, body: SubgraphProfile) -> dict:
        """Store a profile steering the chosen feature nodes (blocking: store writes)."""
        document = profile_document(self.book.get(graph_id), body, self._sae_of)
        stored = self.state.profiles.create(document)
        return {**stored, "active": False}  # a new profile is never the active one

    def circuit(self, graph_id: str, body: SubgraphCircuit) -> dict:
        """Store a miStudio circuit of the chosen feature nodes (blocking: store writes)."""
        document = circuit_document(self.book.get(graph_id), body, self._sae_of)
        return self.state.circuits.import_raw(json.dumps(document).encode(), on_conflict="fail")

    def _sae_of(self, node: GraphNode, i: int) -> str:
        """The SAE steering a chosen node's feature: the node's own, or for a feature of a
        registered transcoder set its block's file, registered as an SAE here (blocking)."""
        name = str(node.sae_id)
        if node.site != "mlp" or "/" not in name:
            return name
        set_id, block = name.split("/", 1)
        found = self.transcoders.get(set_id, param=f"nodes[{i}]").transcoders
        info, _ = self.state.registrations.sae(str(found.files[int(block)]), None, None)
        return info.id

    async def register_transcoders(self, path: str) -> dict:
        """POST /api/transcoders: read a set from an allowed directory and keep it."""
        local = self.state.registrations.paths.local(path, "path")
        registered = await in_passing_thread(self.transcoders.register, local, self.state.switch.lm)
        return registered.view()

    def transcoder_sets(self) -> dict:
        """GET /api/transcoders."""
        return {"object": "list", "data": self.transcoders.sets()}

    def transcoder_set(self, set_id: str) -> dict:
        """GET /api/transcoders/{id}."""
        return self.transcoders.view(set_id)

    def delete_transcoders(self, set_id: str) -> dict:
        """DELETE /api/transcoders/{id}."""
        return self.transcoders.delete(set_id)
