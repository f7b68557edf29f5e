"""The management of imported miStudio documents (clusters and circuits) as steering bases.

Clusters and circuits share their life cycle (list, get, export byte for byte, delete,
deactivate), so one set of functions serves both, parameterised by the kind; what differs
(a cluster's persistent dial and binding, a circuit's rung and layer bindings) has its own.
Check-then-change steps hold the steering lock.
"""

from __future__ import annotations

import json

from millm.formats.mistudio import RUNG_LANGUAGE, authored_intensity, declared_range
from millm.interp.binding import cluster_binding
from millm.kernel.books.documents import DocumentBook
from millm.kernel.steering.base_fit import circuit_status
from millm.kernel.steering.live import circuit_ids
from millm.lab.documents.parts import DocumentParts

KINDS = ("cluster", "circuit")


class BaseManagement:
    """Imported clusters and circuits as steering bases, as the API presents them."""

    def __init__(self, state: DocumentParts):
        self.state = state

    def book(self, kind: str) -> DocumentBook:
        """The store's book of this kind."""
        return self.state.clusters if kind == "cluster" else self.state.circuits

    def is_active(self, kind: str, base_id: str) -> bool:
        """Whether this cluster/circuit is the global steering base (one of the circuits active
        together)."""
        if kind == "circuit":
            return base_id in circuit_ids(self.state.steering.active)
        return self.state.steering.active == {"kind": kind, "id": base_id}

    def view(self, kind: str, row: dict) -> dict:
        """A cluster's or circuit's view."""
        return self.cluster_view(row) if kind == "cluster" else self.circuit_view(row)

    def list_bases(self, kind: str) -> dict:
        """Every imported document of this kind."""
        with self.state.steering.lock:
            return {
                "object": "list",
                "data": [self.view(kind, row) for row in self.book(kind).all()],
            }

    def get_base(self, kind: str, key: str) -> dict:
        """One document by id or name."""
        with self.state.steering.lock:
            return self.view(kind, self.book(kind).find(key))

    def export_base(self, kind: str, key: str) -> str:
        """The document byte for byte as imported (unknown keys included)."""
        return self.book(kind).find(key)["raw"]

    def delete_base(self, kind: str, key: str) -> dict:
        """Remove a document; deleting the active one deactivates it."""
        with self.state.steering.lock:
            row = self.book(kind).find(key)
            if kind == "circuit" and self.is_active(kind, row["id"]):
                left = [i for i in circuit_ids(self.state.steering.active) if i != row["id"]]
                self.state.steering.set_circuits(left)
            elif self.is_active(kind, row["id"]):
                self.state.steering.set_active(None, None)
            self.book(kind).delete(row["id"])
        return {"id": row["id"], "name": row["name"], "deleted": True}

    def deactivate_base(self, kind: str) -> dict:
        """Back to the live values as the base, if one of this kind was active."""
        return {"deactivated": self.state.steering.deactivate(kind)}

    # clusters -------------------------------------------------------------------------------------
    def cluster_view(self, row: dict) -> dict:
        """A cluster: name, members, declared range, persistent dial, whether active."""
        document = self.state.clusters.document(row)
        sae = document.get("sae") or {}
        declared = declared_range(document)
        return {
            "id": row["id"],
            "name": row["name"],
            "active": self.is_active("cluster", row["id"]),
            "intensity": row["intensity"],
            "intensity_range": list(declared) if declared else None,
            "authored_intensity": authored_intensity(document),
            "sae": {
                "layer": sae.get("layer"),
                "n_features": sae.get("n_features"),
                "mistudio_sae_id": sae.get("mistudio_sae_id") or sae.get("sae_id"),
            },
            "members": [
                {
                    "feature_idx": m["feature_idx"],
                    "strength": m["strength"],
                    "sign": m.get("sign", 1),
                    "label": m.get("label"),
                }
                for m in document["members"]
            ],
            "created_at": row["created_at"],
        }

    def import_clusters(self, raw: bytes, on_conflict: str, activate: bool) -> dict:
        """Import a definition or a bundle; `activate` makes the (first) one the base, all or
        nothing."""
        with self.state.steering.lock:
            # An import that is to be activated must bind first: a refused activation stores nothing
            # either.
            check = (
                (lambda definitions: cluster_binding(definitions[0], self.state.steering.attached))
                if activate
                else None
            )
            rows = self.state.clusters.import_raw(raw, on_conflict, check)
            result: dict = {"object": "list"}
            if activate:
                result["activation"] = self.activate_cluster_row(rows[0])
            result["data"] = [self.cluster_view(row) for row in rows]
            return result

    def set_cluster_intensity(self, key: str, intensity: float) -> dict:
        """A cluster's persistent dial within [0, max]; an active cluster's change is live at
        once."""
        with self.state.steering.lock:
            row = self.state.clusters.set_intensity(key, intensity)
            if self.is_active("cluster", row["id"]):
                self.state.steering.bump()
            return self.cluster_view(row)

    def activate_cluster_row(self, row: dict) -> dict:
        """Check the cluster against the attached SAE (400 with the figures), then make it the
        base."""
        binding = cluster_binding(self.state.clusters.document(row), self.state.steering.attached)
        self.state.steering.set_active("cluster", row["id"])
        return {"binding": binding.to_dict(), "live": self.state.steering.enabled}

    def activate_cluster(self, key: str) -> dict:
        """Make a cluster the base (n_features and layer checked against the attached SAE first)."""
        with self.state.steering.lock:
            row = self.state.clusters.find(key)
            activation = self.activate_cluster_row(row)
            return {**self.cluster_view(row), **activation}

    # circuits -------------------------------------------------------------------------------------
    def steering_status(self, row: dict | None) -> dict:
        """Whether and how a circuit is steering now: mode, bindings, rung and its language."""
        if row is None:
            return {"steering": False, "mode": "none", "reason": "no active circuit"}
        try:
            document = self.state.circuits.document(row)
            status = circuit_status(document, self.state.steering)
        except (json.JSONDecodeError, KeyError, TypeError):
            return {
                "steering": False,
                "mode": "none",
                "reason": "the stored definition cannot be parsed",
            }
        active = self.is_active("circuit", row["id"])
        steering = active and self.state.steering.enabled and status.mode != "none"
        reason = (
            "not the active circuit"
            if not active
            else "steering is disabled"
            if not self.state.steering.enabled
            else "no SAE is attached on any member layer"
            if status.mode == "none"
            else "served by its bound layers as a cluster (slice_fallback)"
            if status.mode == "slice_fallback"
            else "every member layer is bound"
        )
        return {
            "steering": steering,
            "mode": status.mode,
            "reason": reason,
            "bindings": [b.to_dict() for b in status.bindings.values()],
            "rung": status.rung,
            "language": RUNG_LANGUAGE[status.rung],
            # The rung header (and its language) is promised only while a circuit genuinely steers
            # in full.
            "rung_header": steering
            and status.mode == "full"
            and len(circuit_ids(self.state.steering.active)) == 1,
        }

    def circuit_view(self, row: dict) -> dict:
        """A circuit's summary and how it would bind now."""
        document = self.state.circuits.document(row)
        status = self.steering_status(row)
        declared = declared_range(document)
        return {
            "id": row["id"],
            "name": row["name"],
            "active": self.is_active("circuit", row["id"]),
            "rung": status.get("rung"),
            "language": status.get("language"),
            "layers": sorted({ref["layer"] for ref in document["saes"]}),
            "members": len(document["members"]),
            "edges": len(document.get("edges") or []),
            "intensity_range": list(declared) if declared else None,
            "authored_intensity": authored_intensity(document),
            "intensity": row.get("intensity"),  # its persistent dial (null: the authored one)
            "steering": status,
            "created_at": row["created_at"],
        }

    def import_circuit(self, raw: bytes, on_conflict: str) -> dict:
        """Import one circuit definition, validated whole and stored byte for byte."""
        row = self.state.circuits.import_raw(raw, on_conflict)
        with self.state.steering.lock:
            return self.circuit_view(row)
