"""The probe book as the plans' ProbeResolver (kernel/steering/resolution.py): a saved probe's watch
for a spec's `when` or `abort`, bound to the loaded model and the SAEs the plan was made with."""

from __future__ import annotations

from collections.abc import Callable

from millm.engine.jobs import Watch, WatchAction
from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit
from millm.errors import ModelNotLoaded
from millm.interp.probes import SKIPPED
from millm.interp.steering import Attached
from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.probes.binding import bind
from millm.kernel.probes.book import ProbeBook


class ProbeConditions:
    """Saved probes as conditions: found by name in the book's shelf, bound when a plan is made."""

    def __init__(
        self,
        probes: ProbeBook,
        calibrations: CalibrationBook,
        model: Callable[[], LoadedModel | None],
    ):
        self.probes, self.calibrations, self.model = probes, calibrations, model

    @property
    def revision(self) -> int:
        """Moves with every change to the probes (plans resolved before it are made afresh)."""
        return self.probes.shelf.revision

    def watch(
        self,
        name: str,
        attached: dict[str, Attached],
        action: WatchAction,
        edit: ResidualEdit | None,
        tokens: int | None,
        detector: dict | None = None,
    ) -> Watch | None:
        """Probe `name` (or `detector`, a spec's own probe, under that name) bound to the loaded
        model and these SAEs, doing `action` (None: no such probe; a 400 when it does not fit, or
        503 when no model is loaded to bind it to)."""
        if detector is None:
            row = self.probes.shelf.get(name)
            if row is None:
                return None
            detector = row["document"]["detector"]
        lm = self.model()
        if lm is None:
            raise ModelNotLoaded(
                f"probe {name!r} needs the loaded model to watch it; load one first"
            )
        probe = bind(attached, self.calibrations, lm, name, detector, "detector")
        return Watch(
            name,
            probe.point,
            probe.score,
            probe.threshold,
            action,
            edit=edit,
            tokens=tokens,
            skip=SKIPPED,
        )
