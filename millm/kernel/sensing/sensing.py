"""Sensing's one owner: which clusters and circuits are switched on (stored, per base), what is
armed now, the reads a generation's rows take, the worker that turns a finished row into events,
the counters the status routes show, and the live feed.

Armed: the active cluster or circuit, when its sensing is on and it fits the attached SAEs (a
cluster must; a circuit senses the edges it can). Every generation row admitted while one is
armed (the active cluster, or each active circuit) keeps, at each layer it senses, the residual
at every position, before the layer's steering (what the model computed); when the row ends, the
scheduler thread encodes the sensed features over all of them in one pass (SAE.encode_features:
the members' columns alone where the activation allows) and hands them over as plain lists.
Encoding once per row rather than once per step keeps the steps as cheap as monitoring's reads
(bench/sensing_cost.py); the price is d floats a position kept until the row ends. Events are
computed, stored and published off the scheduler thread. Rows are read one by one, so a row in a
continuous batch gives the events it gives alone. Scoring passes and embeddings are not sensed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from millm.engine.jobs import ResidualRead, ResidualsRead
from millm.errors import InvalidRequest, MillmError
from millm.kernel.books.documents import CircuitBook, ClusterBook, stored_document
from millm.kernel.monitoring.requests import Origin
from millm.kernel.runtime.feed import LiveFeed
from millm.kernel.sensing.arming import (
    CircuitArm,
    ClusterArm,
    Layer,
    Tuning,
    arm_circuit,
    arm_cluster,
)
from millm.kernel.sensing.events import RowRead, cluster_records, common_prefix, edge_records
from millm.kernel.steering.live import circuit_ids
from millm.kernel.steering.plan_cache import Snapshot
from millm.kernel.steering.plans import Planner
from millm.settings.server import Settings
from millm.store.database import Store
from millm.store.sensing import add_events, put_sensing, sensing_settings

log = logging.getLogger(__name__)

TAG = "sensing"
WORK_BACKLOG = 256  # finished rows waiting for the worker; past it a row's events are dropped
WRITE_BATCH = 32  # rows whose events go to the store in one transaction, when so many wait
OVERHEAD_WARN_MS = 5.0
CONTEXT_FIELDS = ("context_text", "context_token_ids", "context_parts")
Arm = ClusterArm | CircuitArm


@dataclass
class SensingCounters:
    """What the status routes show of one kind's sensing since the start."""

    events_recorded: int = 0
    requests_sensed: int = 0
    requests_truncated: int = 0
    # the last sensed row's layers that dropped events past the cap, per circuit
    truncated_by_circuit: dict[str, list[int]] = field(default_factory=dict)
    last_overhead_ms: float | None = None


@dataclass
class Sensed:
    """A generation's sensing: the reads its rows take, and what to do with a finished row's."""

    reads: tuple[ResidualRead, ...]
    on_row: Callable[[int, Sequence[ResidualsRead]], None]


@dataclass(frozen=True)
class _Pending:
    arms: tuple[Arm, ...]
    layers: tuple[Layer, ...]  # what read number i read
    origin: Origin
    row: int
    reads: tuple[ResidualsRead, ...]
    decode: Callable[[list[int]], str]
    overhead_s: float


class Sensing:
    """Sensing's state, and the worker recording events."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        planner: Planner,
        clusters: ClusterBook,
        circuits: CircuitBook,
    ):
        self.store, self.settings, self.planner = store, settings, planner
        self.clusters, self.circuits = clusters, circuits
        self._lock = threading.Lock()
        self._switches = sensing_settings(store)
        self.counters = {"cluster": SensingCounters(), "circuit": SensingCounters()}
        self.dropped_rows = 0
        self._history: dict[str, tuple[Arm, list[int]]] = {}  # base -> (arm, last row's tokens)
        self.feed = LiveFeed()
        self._work: queue.Queue[_Pending | None] = queue.Queue(maxsize=WORK_BACKLOG)
        self.worker = threading.Thread(target=self._run, name="millm-sensing", daemon=True)
        self.worker.start()

    # switches -------------------------------------------------------------------------------------
    def reload(self) -> None:
        """Read the switches again (another replica changed them)."""
        switches = sensing_settings(self.store)
        with self._lock:
            self._switches = switches

    def switch(self, kind: str, base_id: str) -> tuple[bool, dict]:
        """A base's switch and config (off, {} when never set)."""
        with self._lock:
            return self._switches.get((kind, base_id), (False, {}))

    def set_switch(self, kind: str, base_id: str, enabled: bool, config: dict) -> None:
        """Store a base's switch and config; a change re-arms it (its history is cleared)."""
        put_sensing(self.store, kind, base_id, enabled, config)
        with self._lock:
            self._switches[(kind, base_id)] = (enabled, config)
            self._history.pop(base_id, None)

    def enabled(self, kind: str) -> list[str]:
        """The ids of the bases of `kind` whose sensing is on."""
        with self._lock:
            return [base for (k, base), (on, _) in self._switches.items() if k == kind and on]

    def tuning(self, kind: str, base_id: str) -> Tuning:
        """The rules a base is sensed by: this server's settings under its own config."""
        s = self.settings
        base = Tuning(
            s.sensing_epsilon,
            s.sensing_theta_floor,
            s.sensing_context_tokens,
            max_token_lag=s.circuit_sensing_max_token_lag,
        )
        return base.over(self.switch(kind, base_id)[1])

    # arming ---------------------------------------------------------------------------------------
    def arm(self, kind: str, base_id: str, now: Snapshot | None = None) -> Arm:
        """The base armed on the attached SAEs now (a 400 when a cluster cannot be sensed; 404
        for an unknown base)."""
        now = now or self.planner.now()
        book = self.clusters if kind == "cluster" else self.circuits
        shelf = now.clusters if kind == "cluster" else now.circuits
        row = book.find_in(shelf, base_id)
        document = stored_document(shelf, row)
        arming = arm_cluster if kind == "cluster" else arm_circuit
        return arming(row, document, now.attached, self.tuning(kind, row["id"]))

    def armed(self, now: Snapshot | None = None) -> tuple[list[Arm], str | None]:
        """What is sensed now (the active cluster, or each active circuit, whose sensing is on
        and that fits), and why one switched on is not armed."""
        now = now or self.planner.now()
        active = now.active
        if active is None or active["kind"] not in ("cluster", "circuit"):
            return [], None
        kind = active["kind"]
        ids = circuit_ids(active) if kind == "circuit" else [active["id"]]
        arms: list[Arm] = []
        problem = None
        for base_id in ids:
            if not self.switch(kind, base_id)[0]:
                continue
            try:
                arms.append(self.arm(kind, base_id, now))
            except MillmError as exc:
                problem = exc.message
        return arms, problem

    # a generation's rows --------------------------------------------------------------------------
    def read_for(self, origin: Origin, decode: Callable[[list[int]], str]) -> Sensed | None:
        """For `origin`'s generation starting now: the reads its rows take and the hand-over of a
        finished row (None when nothing is armed). `decode` turns ids into context text."""
        now = self.planner.now()  # one steering state for what is armed and the SAEs it reads
        arms = [
            arm
            for arm in self.armed(now)[0]
            if isinstance(arm, ClusterArm)
            or arm.edges  # a circuit with no edge to sense reads nothing
        ]
        if not arms:
            return None
        wanted: dict[tuple[int, str], set[int]] = {}  # (point, sae) -> features, over every arm
        for arm in arms:
            for layer in [arm.read] if isinstance(arm, ClusterArm) else arm.reads:
                wanted.setdefault((layer.point, layer.sae_id), set()).update(layer.features)
        layers = [
            Layer(-1, sae_id, point, tuple(sorted(features)))
            for (point, sae_id), features in sorted(wanted.items())
        ]
        attached = now.attached
        spent = [0.0]  # seconds the scheduler thread spent encoding this generation's features

        def encode_with(sae, features: tuple[int, ...]):
            index = torch.tensor(features, dtype=torch.long, device=sae.W_enc.device)

            def encode(kept: torch.Tensor) -> list[list[float]]:
                # once, when the row ends, over every position: one matmul, not one a step
                started = time.perf_counter()
                with torch.inference_mode():
                    acts = sae.encode_features(kept.to(sae.W_enc.device), index).float().cpu()
                spent[0] += time.perf_counter() - started
                return acts.tolist()  # the worker then touches no torch at all

            return encode

        reads = tuple(
            ResidualRead(
                layer.point,
                False,
                "all",
                f"{TAG}:{number}",
                encode=encode_with(attached[layer.sae_id].sae, layer.features),
            )
            for number, layer in enumerate(layers)
        )

        def on_row(row: int, finished: Sequence[ResidualsRead]) -> None:
            pending = _Pending(
                tuple(arms), tuple(layers), origin, row, tuple(finished), decode, spent[0]
            )
            try:
                self._work.put_nowait(pending)
            except queue.Full:
                self.dropped_rows += 1
                log.warning("sensing cannot keep up: dropped row %d of %s", row, origin.request_id)

        return Sensed(reads, on_row)

    # the worker -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            # the rows waiting now are recorded together: one store write for all their events
            batch = [self._work.get()]
            while len(batch) < WRITE_BATCH and batch[-1] is not None:
                try:
                    batch.append(self._work.get_nowait())
                except queue.Empty:
                    break
            rows = [pending for pending in batch if pending is not None]
            try:
                if rows:
                    self._record_rows(rows)
            except Exception:  # a store that failed: these rows' events are lost, not later ones
                log.exception("sensing could not store the events of %d rows", len(rows))
            finally:
                for _ in batch:
                    self._work.task_done()
            if len(rows) < len(batch):
                return

    def _record_rows(self, rows: list[_Pending]) -> None:
        made: dict[str, list[dict]] = {"cluster": [], "circuit": []}
        for pending in rows:
            try:
                recorded = self._record(pending)
            except Exception:  # one bad row must not cost the others their events
                log.exception(
                    "sensing failed on row %d of %s", pending.row, pending.origin.request_id
                )
                continue
            for kind, records in recorded.items():
                made[kind] += records
        keep, age = self.settings.sensing_max_events_kept, self.settings.sensing_max_age_days
        for kind, records in made.items():
            add_events(self.store, kind, records, keep, age * 86400)
            for record in records:
                self.feed.publish({k: v for k, v in record.items() if k not in CONTEXT_FIELDS})

    def _record(self, pending: _Pending) -> dict[str, list[dict]]:
        """One row's events by kind (not yet stored), its counters counted."""
        origin = pending.origin
        by_layer = {pending.layers[int(r.tag.split(":")[1])]: r for r in pending.reads}
        first = pending.reads[0]
        read = RowRead(
            origin.request_id,
            pending.row,
            len(origin.prompts[pending.row // max(1, origin.choices)]),
            list(first.token_ids),
            {(layer.point, layer.sae_id): r.encoded for layer, r in by_layer.items()},
            list(first.positions),
            {(layer.point, layer.sae_id): layer.features for layer in by_layer},
        )
        cap = self.settings.sensing_max_events_per_request
        shedding: dict[str, list[int]] = {}
        made: dict[str, list[dict]] = {"cluster": [], "circuit": []}
        for arm in pending.arms:
            kind = "cluster" if isinstance(arm, ClusterArm) else "circuit"
            counters = self.counters[kind]
            if isinstance(arm, ClusterArm):
                records = cluster_records(arm, read, cap, pending.decode, self._reported(arm, read))
                truncated = bool(records and records[-1]["truncated"])
            else:  # each circuit its own budget and rings: one never closes another's edge
                records, shed = edge_records(arm, read, cap, pending.decode)
                truncated = bool(shed)
                shedding[arm.base_id] = sorted(shed)
            for record in records:
                record["model"] = origin.model
            made[kind] += records
            counters.requests_sensed += 1
            counters.requests_truncated += truncated
            counters.events_recorded += len(records)
            counters.last_overhead_ms = pending.overhead_s * 1000
        if any(isinstance(arm, CircuitArm) for arm in pending.arms):
            self.counters["circuit"].truncated_by_circuit = shedding
        return made

    def _reported(self, arm: ClusterArm, read: RowRead) -> int:
        """How many leading positions the previous row sensed for this arm already reported (a
        resent conversation), and this row kept as the next one's history."""
        with self._lock:
            before = self._history.get(arm.base_id)
            self._history[arm.base_id] = (arm, read.token_ids)
        if before is None or before[0] != arm or not self.settings.sensing_dedup_history:
            return 0  # (re)armed since: nothing reported yet
        return common_prefix(before[1], read.token_ids)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every handed-over row is recorded (tests, and reads that must see them)."""
        deadline = time.monotonic() + timeout
        while self._work.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker once it has recorded what is queued."""
        try:
            self._work.put(None, timeout=timeout)
        except queue.Full:
            log.warning("sensing worker did not drain its queue within %.0f s", timeout)
        self.worker.join(timeout)


def check_min_k(arm: ClusterArm, min_k: int | None) -> None:
    """A quorum of 1 to the sensable members, or a 400 naming both counts."""
    if min_k is not None and not 1 <= min_k <= arm.sensable:
        raise InvalidRequest(
            f"min_k must be 1 to {arm.sensable} (the cluster has {len(arm.thetas)} members, "
            f"{arm.sensable} of them sensable), got {min_k}",
            param="min_k",
        )
