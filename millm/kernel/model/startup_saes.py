"""The SAEs named on the command line (`--sae`, MILLM_SAES) and their labels (`--sae-labels`).

They are registered before the server listens, so a wrong name, an unreadable file or a hub that
cannot be reached stops the start with the reason (as a wrong --model does). They are attached
each time the start-up model loads; one that does not fit the model is kept as an error that
readiness reports (503), never dropped in silence: a server started to steer through an SAE does
not answer as if it were attached.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from millm.engine.loader import LoadedModel
from millm.errors import InvalidRequest, MillmError
from millm.kernel.books.label_sources import import_source
from millm.kernel.books.labels import LabelBook
from millm.kernel.model.registrations import ClientRegistrations
from millm.kernel.model.sae_specs import SAESpec, parse_sae_spec
from millm.kernel.steering.live import Steering
from millm.settings import Settings

log = logging.getLogger(__name__)
NO_LABELS = "-"


@dataclass(frozen=True)
class StartupSAE:
    """One --sae: what the user wrote, the SAE it registered, and its labels' source."""

    spec: SAESpec
    sae_id: str
    labels: str | None


class StartupSAEs:
    """Register at start (before listening), attach on every load of the start-up model."""

    def __init__(
        self,
        settings: Settings,
        registrations: ClientRegistrations,
        steering: Steering,
        labels: LabelBook,
    ):
        self.settings, self.registrations = settings, registrations
        self.steering, self.labels = steering, labels
        self.saes: list[StartupSAE] = []
        self._mutex = threading.Lock()
        self.errors: dict[str, str] = {}  # --sae text -> why it is not attached

    def register(self) -> None:
        """Resolve, fetch and read each --sae, and import its labels; the first problem raises."""
        specs = [parse_sae_spec(text) for text in self.settings.sae]
        sources = list(self.settings.sae_labels)
        if len(sources) > len(specs):
            raise InvalidRequest(
                f"{len(sources)} --sae-labels for {len(specs)} --sae: give one per --sae, in "
                f"order ('{NO_LABELS}' for none)",
                param="sae_labels",
            )
        for index, spec in enumerate(specs):
            info = self.registrations.startup_sae(spec)
            source = sources[index] if index < len(sources) else None
            if source in (None, NO_LABELS):
                source = None
            else:
                _, counts = import_source(
                    self.labels, info, source, self.settings.neuronpedia_url, replace=True
                )
                log.info("%s: %d labels imported from %s", spec.text, counts.total, source)
            self.saes.append(StartupSAE(spec, info.id, source))
            log.info("SAE %s registered as %s (layer %s)", spec.text, info.id, info.layer)

    def attach(self, lm: LoadedModel) -> None:
        """Attach each start-up SAE not attached yet (a restart restores earlier attachments)."""
        errors: dict[str, str] = {}
        for sae in self.saes:
            if sae.sae_id in self.steering.attached:
                continue
            try:
                attached = self.steering.attach(lm, sae.sae_id, None)
            except MillmError as exc:
                errors[sae.spec.text] = (
                    f"--sae {sae.spec.text} could not be attached: {exc.message}"
                )
                log.error("%s", errors[sae.spec.text])
                continue
            log.info("SAE %s attached to %s at layer %s", sae.sae_id, lm.name, attached.layer)
        with self._mutex:
            self.errors = errors

    @property
    def error(self) -> str | None:
        """Why a start-up SAE is not attached, if one is not."""
        with self._mutex:
            return "; ".join(self.errors.values()) or None
