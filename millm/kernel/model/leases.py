"""Model leases: a client doing a long job keeps the loaded model from being swapped away.

A lease is on the loaded model, one at a time, held by a free-text `holder` for a `reason`, for
`ttl_seconds` (1 to MAX_TTL_S, renewable). While it lives, a load of another model, an unload of
it, or a request that would load another model is refused with 409 model_leased, unless it
presents the lease's id in X-miLLM-Lease: then it proceeds, and the swap ends the lease
(`model_unloaded`). Requests naming the leased model are served as ever: a lease blocks swaps,
not use.

The id is 192 random bits, shown once (the grant); only its SHA-256 is kept, compared in constant
time, and logged as its first 8 hex digits. Expiry is lazy, on the monotonic clock (wall-clock
times are for display). Leases live in this process's memory: a restart ends every one, and its
id is then unknown (404, saying so). The last MAX_ENDED ended leases are remembered, so an id
that ended says how (409 lease_expired).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from millm.errors import LeaseExpired, LeaseNotFound, ModelLeased

log = logging.getLogger(__name__)
MAX_TTL_S = 7200
DEFAULT_TTL_S = 7200
MAX_ENDED = 64
HEADER = "X-miLLM-Lease"
# The lease id this request presented (set from the header by the server for every request; read
# on the event loop, and handed on to the thread a load runs on).
presented: ContextVar[str | None] = ContextVar("presented_lease", default=None)


def digest(token: str) -> str:
    """What is kept of a lease id: its SHA-256."""
    return hashlib.sha256(token.encode()).hexdigest()


def iso(moment: datetime) -> str:
    """An ISO-8601 UTC time, to the second."""
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class ModelLease:
    """One lease: what it is on, who holds it and why, and when it ends (monotonic)."""

    digest: str
    model: str
    holder: str
    reason: str
    ttl: int
    acquired_at: datetime
    renewed_at: datetime | None
    deadline: float  # monotonic
    expires_at: datetime  # wall clock, for display

    @property
    def ref(self) -> str:
        """How logs name it (never the id)."""
        return self.digest[:8]


@dataclass(frozen=True)
class EndedLease:
    """A lease that ended, and how: released, expired, model_unloaded."""

    lease: ModelLease
    end_reason: str
    ended_at: datetime


class LeaseBook:
    """The live lease (at most one: only the loaded model can be leased) and the last ended ones;
    `clock` and `wall` are the monotonic and the wall clock."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.clock, self.wall = clock, wall
        self._mutex = threading.Lock()
        self._live: ModelLease | None = None
        self._ended: collections.OrderedDict[str, EndedLease] = collections.OrderedDict()

    # reads ----------------------------------------------------------------------------------------
    def live(self, resident: str | None) -> ModelLease | None:
        """The live lease, if any (ending it first if it expired or its model left)."""
        with self._mutex:
            return self._current(resident)

    def view(self, model: str, resident: str | None) -> dict:
        """GET /api/models/{name}/lease: the live lease on `model` (never its id) and the last one
        that ended on it."""
        with self._mutex:
            lease = self._current(resident)
            last = next((e for e in reversed(self._ended.values()) if e.lease.model == model), None)
        return {
            "lease": status(lease, self.clock()) if lease and lease.model == model else None,
            "last_ended": ended_view(last) if last else None,
        }

    # changes --------------------------------------------------------------------------------------
    def grant(self, model: str, holder: str, reason: str, ttl: int) -> tuple[str, dict]:
        """A new lease on the loaded `model` (409 model_leased while one lives): its id (the only
        time it is shown) and its status."""
        token = secrets.token_urlsafe(24)
        now = self.wall()
        with self._mutex:
            held = self._current(model)
            if held is not None:
                raise leased(held, "lease", model)
            self._live = lease = ModelLease(
                digest(token), model, holder, reason, ttl, now, None,
                self.clock() + ttl, now + timedelta(seconds=ttl),
            )  # fmt: skip
        log.info("lease %s granted on %s to %r for %d s", lease.ref, model, holder, ttl)
        return token, status(lease, self.clock())

    def renew(self, model: str, token: str | None, ttl: int, resident: str | None) -> dict:
        """The lease `token` names, to end `ttl` seconds from now."""
        with self._mutex:
            lease = self._owned(model, token, resident)
            now = self.wall()
            self._live = lease = replace(
                lease,
                ttl=ttl,
                renewed_at=now,
                deadline=self.clock() + ttl,
                expires_at=now + timedelta(seconds=ttl),
            )
        return status(lease, self.clock())

    def release(self, model: str, token: str | None, resident: str | None) -> dict:
        """End the lease `token` names (`released`)."""
        with self._mutex:
            lease = self._owned(model, token, resident)
            ended = self._end(lease, "released")
        return ended_view(ended)

    # what a lease refuses -------------------------------------------------------------------------
    def refusal(
        self, resident: str | None, target: str, operation: str, token: str | None
    ) -> ModelLeased | None:
        """409 model_leased when `operation` ("load", "unload") on `target` would take the leased
        model away (a load of another model, an unload of it), unless `token` is the lease's id."""
        with self._mutex:
            lease = self._current(resident)
        if lease is None or matches(lease, token):
            return None
        takes_it = (target == lease.model) if operation == "unload" else (target != lease.model)
        return leased(lease, operation, target) if takes_it else None

    def held_by(self, token: str, resident: str | None) -> ModelLease:
        """The live lease `token` is the id of (404 lease_not_found, 409 lease_expired)."""
        with self._mutex:
            lease = self._current(resident)
            known = self._ended.get(digest(token))
            model = lease.model if lease else known.lease.model if known else resident or ""
            return self._owned(model, token, resident)

    def model_left(self, model: str) -> None:
        """The leased model was unloaded (by its holder's own swap): its lease ends."""
        with self._mutex:
            if self._live is not None and self._live.model == model:
                self._end(self._live, "model_unloaded")

    # under the mutex ------------------------------------------------------------------------------
    def _current(self, resident: str | None) -> ModelLease | None:
        lease = self._live
        if lease is None:
            return None
        if self.clock() >= lease.deadline:
            self._end(lease, "expired")
            return None
        if lease.model != resident:
            self._end(lease, "model_unloaded")
            return None
        return lease

    def _owned(self, model: str, token: str | None, resident: str | None) -> ModelLease:
        lease = self._current(resident)
        if lease is not None and lease.model == model and matches(lease, token):
            return lease
        known = self._ended.get(digest(token)) if token else None
        if known is not None and known.lease.model == model:
            raise LeaseExpired(
                f"lease on {model!r} ended ({known.end_reason}) at {iso(known.ended_at)}",
                param=HEADER,
            )
        raise LeaseNotFound(
            f"unknown lease on {model!r} (send the id its grant returned in {HEADER}); a restart "
            "ends every lease",
            param=HEADER,
        )

    def _end(self, lease: ModelLease, reason: str) -> EndedLease:
        ended = EndedLease(lease, reason, self.wall())
        self._live = None if self._live is lease else self._live
        self._ended[lease.digest] = ended
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)
        log.info("lease %s on %s ended: %s", lease.ref, lease.model, reason)
        return ended


def matches(lease: ModelLease, token: str | None) -> bool:
    """Whether `token` is this lease's id (compared in constant time)."""
    return token is not None and hmac.compare_digest(lease.digest, digest(token))


def status(lease: ModelLease, now: float) -> dict:
    """A lease as reads show it: never its id."""
    return {
        "model": lease.model,
        "holder": lease.holder,
        "reason": lease.reason,
        "acquired_at": iso(lease.acquired_at),
        "renewed_at": iso(lease.renewed_at) if lease.renewed_at else None,
        "expires_at": iso(lease.expires_at),
        "ttl_seconds": lease.ttl,
        "seconds_remaining": max(0, round(lease.deadline - now)),
    }


def ended_view(ended: EndedLease) -> dict:
    """An ended lease as reads show it."""
    lease = ended.lease
    return {
        "model": lease.model,
        "holder": lease.holder,
        "reason": lease.reason,
        "acquired_at": iso(lease.acquired_at),
        "expires_at": iso(lease.expires_at),
        "end_reason": ended.end_reason,
        "ended_at": iso(ended.ended_at),
    }


def leased(lease: ModelLease, operation: str, target: str) -> ModelLeased:
    """409 model_leased: who holds the lease, why and until when; never its id."""
    return ModelLeased(
        f"model {lease.model!r} is leased by {lease.holder!r} until {iso(lease.expires_at)} "
        f"({lease.reason}); {operation} of {target!r} refused. Send the lease's id in {HEADER} "
        "to go ahead (the lease then ends), or wait for it to end",
        param="model",
    )
