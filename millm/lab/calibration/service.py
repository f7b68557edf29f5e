"""Calibrations as the API presents them: start one, read it, forget it (blocking; worker pool)."""

from __future__ import annotations

from millm.errors import InvalidRequest, ModelNotLoaded, NotFound
from millm.interp.steering import check_feature
from millm.kernel.books.calibrations import CalibrationView
from millm.kernel.runtime.jobs import JobView
from millm.lab.calibration.job import CalibrationRun
from millm.lab.calibration.parts import CalibrationParts
from millm.lab.calibration.protocol import CalibrateRequest, check_size, check_source, corpus_ids
from millm.lab.discovery.inputs import attached_sae

MAX_FEATURES_SHOWN = 1000  # features one GET may ask figures of


def parse_features(text: str | None) -> list[int] | None:
    """`?features=1,2,3` as indices (None when absent); 400 naming the bad entry."""
    if text is None:
        return None
    indices = []
    for part in (p.strip() for p in text.split(",")):
        if not part.isdigit():
            raise InvalidRequest(
                f"features: {part!r} is not a feature index (give comma-separated integers, e.g. "
                "1,2,3)",
                param="features",
            )
        indices.append(int(part))
    if len(indices) > MAX_FEATURES_SHOWN:
        raise InvalidRequest(
            f"features: at most {MAX_FEATURES_SHOWN} per request, got {len(indices)}",
            param="features",
        )
    return list(dict.fromkeys(indices))


def not_calibrated(sae_id: str, model: str) -> NotFound:
    """404 calibration_not_found, saying how to make one."""
    return NotFound(
        f"SAE {sae_id} is not calibrated on model {model!r}; POST /api/saes/{sae_id}/calibrate "
        "(with the SAE attached) makes one",
        param="sae_id",
        code="calibration_not_found",
    )


class CalibrationManagement:
    """Calibrations as the API presents them."""

    def __init__(self, state: CalibrationParts):
        self.state = state

    def start(self, sae_id: str, request: CalibrateRequest) -> JobView:
        """Check the request against the loaded model (the SAE attached, the corpus within
        MILLM_CALIBRATION_MAX_TOKENS), then start the calibration job and return it."""
        info = self.state.saes.get(sae_id)
        check_source(request)
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded(
                "no model is loaded to calibrate the SAE on; load one and attach the SAE first"
            )
        with self.state.steering.lock:
            attached = attached_sae(self.state, info, lm)
        offered = corpus_ids(lm.tokenizer, request, info, lm.context_length)
        corpus = offered.first_tokens(request.max_tokens)
        check_size(
            corpus,
            self.state.settings.calibration_max_tokens,
            "corpus" if request.corpus else "texts",
        )
        claim = self.state.calibrations.claim(sae_id, lm.name)
        run = CalibrationRun(
            self.state,
            attached,
            lm.name,
            lm.system_fingerprint,
            lm.tokenizer,
            corpus,
            request,
            claim,
            offered,
        )
        description = (
            f"calibrate {sae_id} on {lm.name} over {len(corpus.texts)} texts "
            f"({corpus.tokens} tokens)"
        )
        try:
            view = self.state.jobs.start(
                "calibration", description, len(corpus.texts), "texts", run
            )
        except BaseException:
            self.state.calibrations.release(sae_id, lm.name, claim)
            raise
        claim["job"] = view.id
        return view

    def view(self, sae_id: str, model: str | None, features: str | None) -> CalibrationView:
        """The calibration of `sae_id` on `model` (default: the server's model), with the figures of
        `features`; 404 calibration_not_found when there is none."""
        info = self.state.saes.get(sae_id)
        name = model or self.state.switch.expected_name
        indices = parse_features(features)
        for index in indices or []:
            check_feature(info, index, param="features")
        summary = self.state.calibrations.summary(sae_id, name)
        if summary is None:
            raise not_calibrated(sae_id, name)
        shown = None
        if indices is not None:
            figures = self.state.calibrations.figures(sae_id, name, indices)
            shown = [figures[i] for i in indices if i in figures]
        return CalibrationView(summary=summary, features=shown)

    def delete(self, sae_id: str, model: str | None) -> dict:
        """Forget the calibration of `sae_id` on `model` (default: the server's model); the one the
        SAE ships for that model, if any, takes its place again. 404 when there is none to
        forget."""
        info = self.state.saes.get(sae_id)
        name = model or self.state.switch.expected_name
        if not self.state.calibrations.delete(sae_id, name):
            raise not_calibrated(sae_id, name)
        restored = self.state.calibrations.import_shipped(info, name)
        return {
            "object": "calibration",
            "sae_id": sae_id,
            "model": name,
            "deleted": True,
            "restored_shipped": restored,
        }
