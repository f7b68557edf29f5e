"""What labelling offers the routes: start an explaining job, read the explanations it stored."""

from __future__ import annotations

from millm.kernel.runtime.jobs import JobView
from millm.lab.labels.explain import start_explaining
from millm.lab.labels.parts import LabelParts
from millm.lab.labels.protocol import ExplainRequest, ExplanationView


class Labelling:
    """The labelling routes' one way in."""

    def __init__(self, state: LabelParts):
        self.state = state

    def explain(self, sae_id: str, body: ExplainRequest) -> JobView:
        """Explain and score features of an attached, calibrated SAE (a job)."""
        return start_explaining(self.state, sae_id, body)

    def explanations(self, sae_id: str) -> list[ExplanationView]:
        """Every stored explanation of an SAE, by feature (blocking: the store)."""
        self.state.saes.get(sae_id)
        return [ExplanationView.of(row) for row in self.state.labels.explanations(sae_id)]
