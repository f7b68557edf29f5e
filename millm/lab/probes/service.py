"""Probes as the API presents them: list, read, create, update, delete, import, export, activate
(blocking; worker pool), and train one (a job)."""

from __future__ import annotations

import numpy as np

from millm.errors import Conflict, InvalidRequest, ModelNotLoaded
from millm.formats.probe_documents import (
    PROBE_BUNDLE_KIND,
    probe_bundle,
    validate_probe,
    validate_probe_import,
)
from millm.interp.probes import point_of
from millm.interp.steering import pick_attached
from millm.kernel.probes.binding import bind, check_widths, model_shape
from millm.kernel.probes.book import probe_view
from millm.kernel.runtime.jobs import JobView
from millm.lab.discovery.inputs import check_total, set_prompts
from millm.lab.probes.parts import ProbeParts
from millm.lab.probes.training import (
    ProbeExamples,
    ProbeTrainRequest,
    TrainingRun,
    check_sizes,
    split,
)
from millm.wording import counted


class ProbeManagement:
    """Probes as the API presents them."""

    def __init__(self, state: ProbeParts):
        self.state = state

    def train(self, body: ProbeTrainRequest) -> JobView:
        """Check the request against the loaded model (the name free, the place to read, the texts
        within the discovery caps), then start the job. Blocking (tokenising): a worker thread."""
        settings = self.state.settings
        if body.name in self.state.probes.shelf.by_name:
            raise Conflict(
                f"a probe named {body.name!r} exists; choose another name",
                param="name",
                code="probe_exists",
            )
        check_sizes(body, settings.discovery_max_texts)
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded("no model is loaded to read the texts with; load one first")
        shape = model_shape(lm)
        if body.sae_id is not None:
            attached = pick_attached(dict(self.state.steering.attached), body.sae_id, "sae_id")
            if attached.transcoder:
                raise InvalidRequest(
                    f"{attached.info.id} is a transcoder: it reads block {attached.layer}'s MLP "
                    "input, and a probe reads the residual stream; give layer (and hook_point) "
                    "instead",
                    param="sae_id",
                )
            layer, hook_point = attached.layer, attached.info.hook_point
        else:
            assert body.layer is not None  # _one_place
            layer, hook_point = body.layer, body.hook_point or "resid_post"
            if layer >= shape.layers:
                raise InvalidRequest(
                    f"layer {layer} is past the last layer of {lm.name} ({shape.layers} layers: "
                    f"0..{shape.layers - 1})",
                    param="layer",
                )
        positive, negative = (
            set_prompts(lm, "positive", body.positive),
            set_prompts(lm, "negative", body.negative),
        )
        check_total(positive + negative, settings.discovery_max_tokens)
        labels = np.array([1] * len(positive) + [0] * len(negative))
        train, test = split(labels, body.held_out, body.seed)
        examples = ProbeExamples(
            [ids for _, ids in positive + negative], labels, train, test, len(positive)
        )
        run = TrainingRun(
            self.state, lm.name, body, layer, hook_point, point_of(layer, hook_point), examples
        )
        description = (
            f"train probe {body.name!r} on {lm.name} at layer {layer} ({hook_point}) "
            f"from {len(positive)} positive and {counted(len(negative), 'negative text')}"
        )
        return self.state.jobs.start(
            "probe-training", description, len(examples.prompts), "texts", run
        )

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
        """Replace the fields given (name, description, detector); the result is validated whole,
        and an active probe must still fit the loaded model."""
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
        """Make a probe watch every chat and text completion admitted from now on; checked against
        the loaded model first (its SAE attached, its percentile calibrated) when one is loaded."""
        with self.state.probes.writing():
            row = self.state.probes.find(key)
            checked = self.bind_probe(row["document"], "detector")
            row = self.state.probes.set_active(row["id"], True)
        reason = (
            "it watches every chat and text completion admitted from now on"
            if checked
            else (
                "no model is loaded: it is checked against the model's SAEs and calibrations once "
                "one is, and skipped where it does not fit"
            )
        )
        return {"probe": probe_view(row), "checked": checked, "reason": reason}

    def _check_widths(self, detector: dict, param: str) -> None:
        check_widths(detector, self.state.saes.infos, param)

    def deactivate_probe(self, key: str) -> dict:
        """Stop a probe watching requests."""
        return {"probe": probe_view(self.state.probes.set_active(key, False))}

    def bind_probe(self, document: dict, param: str) -> bool:
        """Check a probe document against the loaded model (a 400 naming `param` when it does not
        fit); False when no model is loaded to check it against."""
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
