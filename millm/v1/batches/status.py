"""A batch's moves through its statuses (validating, in_progress, finalizing, then completed,
failed, cancelled or expired), each stamped with its time."""

from __future__ import annotations

import time


def stamp(batch: dict, status: str) -> dict:
    """The batch moved to `status`, its `<status>_at` stamped (a waiting_reason only while it
    runs)."""
    moved = {**batch, "status": status, f"{status}_at": int(time.time())}
    if status != "in_progress":
        moved["millm"] = {**moved["millm"], "waiting_reason": None}
    return moved


def finalizing(batch: dict) -> dict:
    """A batch in progress whose every line is recorded moves to `finalizing`."""
    return stamp(batch, "finalizing") if batch["status"] == "in_progress" else batch
