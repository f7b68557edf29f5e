"""A probe's detector bound to the loaded model: the SAE attached, the calibration, the residual's
shape.

A request binds its probes once its model is held; activating a probe (or changing an active
one's detector) binds it against the loaded model first, so a probe that cannot watch anything
is refused then rather than skipped later. Binding is blocking work (a calibration lookup):
the callers run it on a worker thread.
"""

from __future__ import annotations

from millm.engine.loader import LoadedModel
from millm.interp.probes import Grids, ModelShape, Scorer, scorer
from millm.interp.sae_files import SAEInfo
from millm.interp.steering import Attached, check_feature
from millm.kernel.books.calibrations import CalibrationBook


def model_shape(lm: LoadedModel) -> ModelShape:
    """What a linear probe must fit: the model's served name, residual width and depth."""
    config = lm.config
    return ModelShape(lm.name, int(config.hidden_size), int(config.num_hidden_layers))


def grids_on(calibrations: CalibrationBook, model: str) -> Grids:
    """Each SAE's calibration grids on `model` (None: not calibrated), for percentile thresholds."""

    def grids(sae_id: str):
        table = calibrations.table(sae_id, model)
        return None if table is None else table.grids

    return grids


def bind(
    attached: dict[str, Attached],
    calibrations: CalibrationBook,
    lm: LoadedModel,
    name: str,
    detector: dict,
    param: str,
) -> Scorer:
    """The detector as a Scorer on `lm` and these attached SAEs (a 400 naming `param` when it
    does not fit)."""
    return scorer(name, detector, attached, grids_on(calibrations, lm.name), model_shape(lm), param)


def check_widths(detector: dict, known: dict[str, SAEInfo], param: str) -> None:
    """Every feature a detector reads within its SAE's width when that SAE is registered (400
    invalid_feature_index naming the index, as a steering entry is), so that a probe past the
    width is refused when it is written, not only when it is first used. A probe may name an SAE
    not registered here (a portable document); it is checked when it binds."""
    info = known.get(detector.get("sae_id", ""))
    if info is None:
        return
    if detector["type"] == "feature":
        check_feature(info, detector["index"], f"{param}.index")
    elif detector["type"] == "weighted":
        for i, feature in enumerate(detector["features"]):
            check_feature(info, feature["index"], f"{param}.features[{i}].index")
