"""What attribution offers the routes: compute a graph, read a recent one, export it."""

from __future__ import annotations

from typing import Any

from millm.protocol.attribution import AttributionGraph, AttributionRequest
from millm.service.attribution.book import GraphBook
from millm.service.attribution.export import circuit_tracer_json
from millm.service.attribution.run import attribute
from millm.service.composition import ServerState


class Attribution:
    """The attribution routes' one way in; keeps the last graphs."""

    def __init__(self, state: ServerState):
        self.state = state
        self.book = GraphBook()

    async def attribute(self, body: AttributionRequest) -> AttributionGraph:
        """POST /api/attribution: compute, check and keep a graph."""
        graph = await attribute(self.state, body)
        self.book.add(graph)
        return graph

    def graph(self, graph_id: str) -> AttributionGraph:
        """A kept graph (404 graph_not_found)."""
        return self.book.get(graph_id)

    def export(self, graph_id: str) -> dict[str, Any]:
        """A kept graph in circuit-tracer's JSON."""
        return circuit_tracer_json(self.book.get(graph_id))
