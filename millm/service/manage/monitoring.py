"""Monitoring settings as the API changes them: validated against the SAEs attached right now."""

from __future__ import annotations

from millm.service.composition import ServerState


def describe(state: ServerState) -> dict:
    """Whether monitoring is on, the SAE and features it watches, and how much it has recorded."""
    with state.steering.lock:
        return state.monitor.describe(state.steering.attached)


def configure(state: ServerState, changes: dict) -> dict:
    """Change any of enabled, sae_id, features, top_k, positions (validated whole, stored)."""
    with state.steering.lock:
        return state.monitor.configure(changes, state.steering.attached, state.saes.get)


def reset(state: ServerState) -> dict:
    """Forget records and statistics (settings stay)."""
    state.monitor.reset()
    return {"reset": True, **state.monitor.statistics()}
