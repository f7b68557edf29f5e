"""The last graphs computed, kept in memory for GET and export (the last GRAPHS_KEPT; a restart
forgets them: export one to keep it)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from millm.errors import NotFound
from millm.lab.attribution.protocol import AttributionGraph

GRAPHS_KEPT = 16


class GraphBook:
    """A bounded, thread-safe map of graph id to graph; the oldest goes first."""

    def __init__(self, kept: int = GRAPHS_KEPT):
        self.kept = kept
        self._graphs: OrderedDict[str, AttributionGraph] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, graph: AttributionGraph) -> None:
        """Keep `graph`, letting the oldest go past the bound."""
        with self._lock:
            self._graphs[graph.id] = graph
            while len(self._graphs) > self.kept:
                self._graphs.popitem(last=False)

    def get(self, graph_id: str) -> AttributionGraph:
        """The graph, or 404 graph_not_found."""
        with self._lock:
            found = self._graphs.get(graph_id)
        if found is None:
            raise NotFound(
                f"no graph {graph_id!r}: the last {self.kept} graphs are kept, in memory only",
                param="graph_id",
                code="graph_not_found",
            )
        return found
