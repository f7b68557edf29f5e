"""Probes as the API presents them: list, read, create, update, delete, import, export, activate
(blocking; worker pool), and train one (a job)."""

from __future__ import annotations

from millm.formats.probe_documents import (
    PROBE_BUNDLE_KIND,
    probe_bundle,
    validate_probe,
    validate_probe_import,
)
from millm.kernel.probes.binding import bind, check_widths
from millm.kernel.probes.book import probe_view
from millm.kernel.runtime.jobs import JobView
from millm.lab.probes.parts import ProbeParts
from millm.lab.probes.training import ProbeTrainRequest, start_training


class ProbeManagement:
    """Probes as the API presents them."""

    def __init__(self, state: ProbeParts):
        self.state = state

    def train(self, body: ProbeTrainRequest) -> JobView:
        """Fit a linear probe from labelled texts (a job)."""
        return start_training(self.state, body)

    def list_probes(self) -> dict:
        """Every saved probe, by name."""
        return {"object": "list", "data": [probe_view(row) for row in self.state.probes.all()]}

    def get_probe(self, key: str) -> dict:
        """A probe by id or name (404 probe_not_found)."""
        return probe_view(self.state.probes.find(key))

    def create_probe(self, document: dict) -> dict:
        """A new probe from a probe document (kind and version may be left out)."""
        self._check_widths(validate_probe(document)["detector"], "detector")
        return probe_view(self.state.probes.create(document))

    def update_probe(self, key: str, changes: dict) -> dict:
        """Replace the fields given (name, description, detector); the result is validated whole, and an
        active probe must still fit the loaded model."""
        with (
            self.state.probes.writing()
        ):  # no activation or other write between the check and the update
            row = self.state.probes.find(key)
            if "detector" in changes:
                merged = validate_probe({**row["document"], **changes})
                self._check_widths(merged["detector"], "detector")
                if row["active"]:
                    self.bind_probe(merged, "detector")
            return probe_view(self.state.probes.update(key, changes))

    def delete_probe(self, key: str) -> dict:
        """Remove a probe (an active one stops watching requests)."""
        row = self.state.probes.delete(key)
        return {"id": row["id"], "name": row["name"], "deleted": True}

    def import_probes(self, payload, on_conflict: str) -> dict:
        """Import a probe document or a bundle, all or nothing (imported probes are inactive)."""
        documents = validate_probe_import(payload)
        bundled = isinstance(payload, dict) and payload.get("kind") == PROBE_BUNDLE_KIND
        for i, document in enumerate(documents):
            self._check_widths(
                document["detector"], f"probes[{i}].detector" if bundled else "detector"
            )
        return {
            "object": "list",
            "data": [
                probe_view(row) for row in self.state.probes.import_documents(payload, on_conflict)
            ],
        }

    def export_probes(self) -> dict:
        """A millm.probe-bundle of every probe."""
        return probe_bundle([row["document"] for row in self.state.probes.all()])

    def export_probe(self, key: str) -> dict:
        """One probe's millm.probe document."""
        return self.state.probes.find(key)["document"]

    def activate_probe(self, key: str) -> dict:
        """Make a probe watch every chat and text completion admitted from now on; checked against the
        loaded model first (its SAE attached, its percentile calibrated) when one is loaded."""
        with self.state.probes.writing():
            row = self.state.probes.find(key)
            checked = self.bind_probe(row["document"], "detector")
            row = self.state.probes.set_active(row["id"], True)
        reason = (
            "it watches every chat and text completion admitted from now on"
            if checked
            else (
                "no model is loaded: it is checked against the model's SAEs and calibrations once one is, and skipped where it does not fit"
            )
        )
        return {"probe": probe_view(row), "checked": checked, "reason": reason}

    def _check_widths(self, detector: dict, param: str) -> None:
        check_widths(detector, self.state.saes.infos, param)

    def deactivate_probe(self, key: str) -> dict:
        """Stop a probe watching requests."""
        return {"probe": probe_view(self.state.probes.set_active(key, False))}

    def bind_probe(self, document: dict, param: str) -> bool:
        """Check a probe document against the loaded model (a 400 naming `param` when it does not fit);
        False when no model is loaded to check it against."""
        lm = self.state.switch.lm
        if lm is None:
            return False
        bind(
            dict(self.state.steering.attached),
            self.state.calibrations,
            lm,
            document["name"],
            document["detector"],
            param,
        )
        return True
