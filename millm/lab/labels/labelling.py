"""What labelling offers the routes: start an explaining job, read the explanations it stored, and
label features by their calibration's top tokens."""

from __future__ import annotations

from millm.errors import InvalidRequest, ModelNotLoaded
from millm.kernel.runtime.jobs import JobView
from millm.lab.discovery.inputs import attached_sae
from millm.lab.labels.explain import (
    ExplainRun,
    beside_writer,
    read_corpus,
    selected,
)
from millm.lab.labels.explain_prompts import prompt_version
from millm.lab.labels.parts import LabelParts
from millm.lab.labels.protocol import ExplainRequest, ExplanationView, LabelImport, TopTokenLabels
from millm.lab.labels.top_tokens import top_token_document
from millm.lab.labels.writers import ServedWriter, digit_ids, writer_for
from millm.wording import counted


def calibrated_on(state: LabelParts, sae_id: str) -> str | None:
    """The model whose calibration of the SAE the feature routes read: the loaded (or last) model's,
    when it has one."""
    model = state.switch.lm.name if state.switch.lm is not None else state.switch.expected_name
    return model if state.calibrations.summary(sae_id, model) is not None else None


def not_calibrated(sae_id: str, on: str, why: str) -> InvalidRequest:
    """400 sae_not_calibrated: what needs the calibration, and how to make one."""
    return InvalidRequest(
        f"SAE {sae_id} is not calibrated on {on}: {why}; calibrate first "
        f"(POST /api/saes/{sae_id}/calibrate)",
        param="sae_id",
        code="sae_not_calibrated",
    )


class Labelling:
    """The labelling routes' one way in."""

    def __init__(self, state: LabelParts):
        self.state = state

    def explain(self, sae_id: str, request: ExplainRequest) -> JobView:
        """Check everything that can be checked before work starts (a 400 naming the field), then
        start the job and return it."""
        info = self.state.saes.get(sae_id)
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded("no model is loaded to explain the SAE's features with; load one")
        with self.state.steering.lock:
            attached = attached_sae(self.state, info, lm)
        summary = self.state.calibrations.summary(sae_id, lm.name)
        if summary is None:
            raise not_calibrated(
                sae_id, repr(lm.name), "explaining reads the calibration's examples"
            )
        features = selected(self.state, sae_id, lm.name, request, info)
        corpus_tokens = read_corpus(self.state, request, summary, info, lm)
        held = corpus_tokens.tokens * len(features) * 4  # float32 activations the job keeps
        cap = self.state.settings.explain_max_activation_bytes  # the job's bound on what it keeps
        if held > cap:
            param = request.selection
            raise InvalidRequest(
                f"{param}: {len(features)} features over a corpus of {corpus_tokens.tokens} "
                f"tokens would keep {held / 2**20:.1f} MiB of activations "
                f"(MILLM_EXPLAIN_MAX_ACTIVATION_BYTES: {cap / 2**20:.1f} MiB); explain fewer "
                "features at a time",
                param=param,
            )
        beside = beside_writer(self.state, request, lm.name)
        explainer = writer_for(
            self.state, request.explainer, lm.name, lm.tokenizer, "explainer", beside
        )
        scorer_kind, _ = request.scorer_kind
        scorer = writer_for(self.state, scorer_kind, lm.name, lm.tokenizer, "scorer", beside)
        if isinstance(scorer, ServedWriter):
            digit_ids(lm.tokenizer)
        version = prompt_version()  # refused now, not mid-job, when delphi's prompts are missing
        run = ExplainRun(
            self.state, attached, lm.name, lm.tokenizer, corpus_tokens, features, request,
            explainer, scorer, version,
        )  # fmt: skip
        description = (
            f"explain {counted(len(features), 'feature')} of {sae_id} with {explainer.name}"
        )
        # Progress counts features, the unit a user chose; reading the corpus first shows as 0 done.
        # The running job's result names the features from the start, so a feature's card can say
        # that a job is explaining it.
        return self.state.jobs.start(
            "explain", description, len(features), "features", run, result=run.outcome([], [])
        )

    def explanations(self, sae_id: str) -> list[ExplanationView]:
        """Every stored explanation of an SAE, by feature (blocking: the store)."""
        self.state.saes.get(sae_id)
        return [ExplanationView.of(row) for row in self.state.labels.explanations(sae_id)]

    def label_top_tokens(self, sae_id: str, request: TopTokenLabels) -> LabelImport:
        """Label the features that fired in the SAE's calibration by their top tokens (blocking:
        the store); 400 sae_not_calibrated when it has no calibration on the model, or one that
        kept no examples."""
        self.state.saes.get(sae_id)
        model = calibrated_on(self.state, sae_id)
        why = "a feature's top tokens are its calibration's top examples"
        if model is None:
            raise not_calibrated(sae_id, "the served model", why)
        summary = self.state.calibrations.summary(sae_id, model)
        if summary is None or summary.top_examples == 0:
            raise not_calibrated(sae_id, f"{model!r} with top examples (it kept none)", why)
        document = top_token_document(self.state.calibrations.figures(sae_id, model).values())
        labels = self.state.labels
        counts = (
            labels.merge(sae_id, document) if request.overwrite else labels.fill(sae_id, document)
        )
        return LabelImport.of(sae_id, document, counts)
