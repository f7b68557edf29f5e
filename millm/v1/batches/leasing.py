"""The leases this replica's running batches hold on its loaded model, so nobody swaps the model
away mid-batch: the batch's own (holder `millm-batch:<id>`, renewed once a third of its time has
passed, released when the batch stops running here) or the caller's (sent when the batch was
made or later; renewed with the caller's own time, never released by the batch).

Leases live in the process that granted them, as every lease does (a restart ends them): each
replica draining a batch holds its own on its own model. A caller's lease that ended gives way
to an own lease; a lease held by somebody else makes the batch wait (`lease_unavailable`), since
no line runs without one.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from millm.errors import LeaseExpired, LeaseNotFound, ModelLeased
from millm.kernel.model.leases import LeaseBook

OWN_HOLDER = "millm-batch:"  # an own lease's holder: this, then the batch's id


@dataclass
class HeldLease:
    """A batch's lease here: its id, whose it is ("own" or "caller") and when to renew it."""

    token: str
    mode: str
    model: str
    renew_at: float  # monotonic


class BatchLeases:
    """Each running batch's lease on this replica's loaded model."""

    def __init__(self, leases: LeaseBook, ttl: int):
        self.leases, self.ttl = leases, ttl
        self._held: dict[str, HeldLease] = {}

    def adopt(self, batch_id: str, token: str, resident: str | None) -> None:
        """Run the batch under the caller's lease `token` (404/409 when it is not live)."""
        lease = self.leases.held_by(token, resident)
        self._release_own(batch_id, resident)
        renew_at = time.monotonic() + lease.ttl / 3
        self._held[batch_id] = HeldLease(token, "caller", lease.model, renew_at)

    def ensure(self, batch_id: str, model: str, resident: str | None) -> str | None:
        """Make sure the batch holds a live lease on `model`, the loaded one: None when it does,
        else why it waits (`lease_unavailable`)."""
        held = self._held.get(batch_id)
        if held is not None and held.model != model:
            self.release(batch_id, resident)
            held = None
        if held is not None:
            try:  # still live? (a caller may release theirs at any time)
                lease = self.leases.held_by(held.token, resident)
                if time.monotonic() >= held.renew_at:
                    ttl = lease.ttl if held.mode == "caller" else self.ttl
                    self.leases.renew(model, held.token, ttl, resident)
                    held.renew_at = time.monotonic() + ttl / 3
            except (LeaseNotFound, LeaseExpired):  # ended (released, expired, model unloaded)
                del self._held[batch_id]
                held = None
        if held is not None:
            return None
        try:
            token, _ = self.leases.grant(
                model, f"{OWN_HOLDER}{batch_id}", f"batch {batch_id}", self.ttl
            )
        except ModelLeased:
            return "lease_unavailable"
        self._held[batch_id] = HeldLease(token, "own", model, time.monotonic() + self.ttl / 3)
        return None

    def batches(self) -> set[str]:
        """The batches holding a lease here."""
        return set(self._held)

    def mode(self, batch_id: str) -> str | None:
        """ "own", "caller", or None (no lease held here)."""
        held = self._held.get(batch_id)
        return held.mode if held is not None else None

    def release(self, batch_id: str, resident: str | None) -> None:
        """The batch stopped running here: its own lease ends (a caller's is left alone)."""
        self._release_own(batch_id, resident)
        self._held.pop(batch_id, None)

    def keep_only(self, running: set[str], resident: str | None) -> None:
        """Release the leases of batches no longer running."""
        for batch_id in [b for b in self._held if b not in running]:
            self.release(batch_id, resident)

    def _release_own(self, batch_id: str, resident: str | None) -> None:
        held = self._held.get(batch_id)
        if held is not None and held.mode == "own":
            with contextlib.suppress(LeaseNotFound, LeaseExpired):  # it ended by itself
                self.leases.release(held.model, held.token, resident)
