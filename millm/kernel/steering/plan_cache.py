"""What plans are made from and kept in: a snapshot of the steering state and the books, copied
under the steering lock, and a small LRU of resolved plans by (state stamp, profile, dial)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from millm.interp.steering import Attached, FeatureOp
from millm.kernel.books.base import Shelf
from millm.kernel.steering.plan import Plan

if TYPE_CHECKING:
    from millm.kernel.steering.live import Steering

PLANS_KEPT = 64  # plans of one state: bases x dials x per-request profiles in use at once


@dataclass(frozen=True)
class Snapshot:
    """What plans are made from, copied under the steering lock and then read without it."""

    stamp: tuple[int, ...]  # moves with every change a plan depends on (see state_stamp)
    version: int
    enabled: bool
    active: dict | None
    attached: dict[str, Attached]
    features: dict[str, dict[int, FeatureOp]]
    stored: frozenset[str]  # the SAEs the store says are attached (on any replica)
    profiles: Shelf
    clusters: Shelf
    circuits: Shelf

    @classmethod
    def taken(
        cls, steering: Steering, stamp: tuple[int, ...], shelves: tuple[Shelf, Shelf, Shelf]
    ) -> Snapshot:
        """Copies of what the steering lock guards (call under it)."""
        features = {sae_id: dict(ops) for sae_id, ops in steering.features.items()}
        return cls(
            stamp,
            steering.version,
            steering.enabled,
            steering.active,
            dict(steering.attached),
            features,
            frozenset(steering.stored),
            *shelves,
        )


def state_stamp(
    steering: Steering, clusters: Shelf, circuits: Shelf
) -> tuple[tuple[int, ...], tuple[Shelf, Shelf, Shelf]]:
    """The steering state's stamp and the books' shelves it names (call under the steering lock).

    The version moves with every stored steering change, `changes` also with a restore (and a
    model's unload), a book's revision with every write through it (a profile edited or deleted,
    a cluster's dial), and the probes' and vectors' revisions with every change to them.
    """
    shelves = (steering.profiles.shelf, clusters, circuits)
    return (
        steering.version,
        steering.changes,
        *(shelf.revision for shelf in shelves),
        *steering.resolvers.revision,
    ), shelves


def epoch_of(stamp: tuple[int, ...]) -> tuple[int, ...]:
    """The part of a state stamp that steering writes move (version, changes, the three books'
    revisions), not the probes' and vectors': the steering epoch a plan is resolved in. Global on
    purpose, as the original miLLM's is: an unrelated profile's edit also counts as a move."""
    return stamp[:5]


class PlanCache:
    """Resolved plans by (state stamp, profile, dial): a small LRU shared by request handlers."""

    def __init__(self, size: int = PLANS_KEPT):
        self.size = size
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Plan | None:
        """The plan kept under this key, if any."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
            return plan

    def put(self, key: tuple, plan: Plan) -> None:
        """Keep a plan, dropping the least recently used past the size (older states go first)."""
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)
