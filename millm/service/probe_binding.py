"""A probe's detector bound to the loaded model: the SAE attached, the calibration, the residual's shape.

A request binds its probes once its model is held; activating a probe (or changing an active
one's detector) binds it against the loaded model first, so a probe that cannot watch anything
is refused then rather than skipped later. Binding is blocking work (a calibration lookup):
the callers run it on a worker thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from millm.engine.loader import LoadedModel
from millm.interp.probes import Grids, ModelShape, Scorer, scorer

if TYPE_CHECKING:  # the state holds the probe book, whose conditions bind through here
    from millm.service.state import ServerState


def model_shape(lm: LoadedModel) -> ModelShape:
    """What a linear probe must fit: the model's served name, residual width and depth."""
    config = lm.model.config
    return ModelShape(lm.name, int(config.hidden_size), int(config.num_hidden_layers))


def grids_on(state: ServerState, model: str) -> Grids:
    """Each SAE's calibration grids on `model` (None: not calibrated), for percentile thresholds."""

    def grids(sae_id: str):
        table = state.calibrations.table(sae_id, model)
        return None if table is None else table.grids

    return grids


def bind(state: ServerState, lm: LoadedModel, name: str, detector: dict, param: str) -> Scorer:
    """The detector as a Scorer on `lm` and the SAEs attached now (a 400 naming `param` when it does not fit)."""
    return scorer(name, detector, dict(state.steering.attached), grids_on(state, lm.name), model_shape(lm), param)


def bind_probe(state: ServerState, document: dict, param: str) -> bool:
    """Check a probe document against the loaded model (a 400 naming `param` when it does not fit);
    False when no model is loaded to check it against."""
    lm = state.lm
    if lm is None:
        return False
    bind(state, lm, document["name"], document["detector"], param)
    return True
