"""Monitoring (/api/monitoring, docs/monitoring.md): its settings and what it has read."""
