"""Monitoring settings as the API changes them: validated against the SAEs attached right now.
Its reads (records, prompts, statistics, the feed) are the kernel's Monitor's own, which the
routes reach directly."""

from __future__ import annotations

from millm.lab.monitoring.parts import MonitoringParts


class MonitorManagement:
    """Monitoring as the API presents and changes it."""

    def __init__(self, state: MonitoringParts):
        self.state = state

    def describe(self) -> dict:
        """Whether monitoring is on, the SAE and features it watches, and how much it has
        recorded."""
        with self.state.steering.lock:
            return self.state.monitor.describe(self.state.steering.attached)

    def configure(self, changes: dict) -> dict:
        """Change any of enabled, sae_id, features, top_k, positions, percentiles, tokens, labels
        (validated whole, stored)."""
        with self.state.steering.lock:
            return self.state.monitor.configure(
                changes, self.state.steering.attached, self.state.saes.get
            )

    def reset(self) -> dict:
        """Forget records and statistics (settings stay)."""
        self.state.monitor.reset()
        return {"reset": True, **self.state.monitor.statistics()}
