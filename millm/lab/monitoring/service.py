"""Monitoring settings as the API changes them: validated against the SAEs attached right now."""

from __future__ import annotations

from millm.kernel.monitoring.monitor import Subscriber
from millm.lab.monitoring.parts import MonitoringParts


class MonitorManagement:
    """Monitoring as the API presents and changes it."""

    def __init__(self, state: MonitoringParts):
        self.state = state

    def describe(self) -> dict:
        """Whether monitoring is on, the SAE and features it watches, and how much it has recorded."""
        with self.state.steering.lock:
            return self.state.monitor.describe(self.state.steering.attached)

    def configure(self, changes: dict) -> dict:
        """Change any of enabled, sae_id, features, top_k, positions, percentiles, tokens, labels (validated whole, stored)."""
        with self.state.steering.lock:
            return self.state.monitor.configure(
                changes, self.state.steering.attached, self.state.saes.get
            )

    def reset(self) -> dict:
        """Forget records and statistics (settings stay)."""
        self.state.monitor.reset()
        return {"reset": True, **self.state.monitor.statistics()}

    def recent(self, limit: int, after: int | None) -> list[dict]:
        """The last `limit` records, or those after record id `after`."""
        return self.state.monitor.recent(limit, after)

    def prompt(self, request_id: str) -> dict:
        """The prompts of a request monitoring recorded, as the model read them (404 once not kept)."""
        return self.state.monitor.prompt(request_id)

    def statistics(self) -> dict:
        """Per-feature statistics since the last reset."""
        return self.state.monitor.statistics()

    def subscribe(self) -> Subscriber:
        """A live feed of new records (unsubscribe when done)."""
        return self.state.monitor.subscribe()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """End a live feed."""
        self.state.monitor.unsubscribe(subscriber)
