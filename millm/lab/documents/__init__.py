"""Steering documents (/api/clusters, /api/circuits, docs/clusters-circuits.md): clusters,
circuits and the active base."""
