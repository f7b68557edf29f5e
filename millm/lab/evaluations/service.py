"""/api/evaluations: start a steering evaluation (a job), read, export and delete the results."""

from __future__ import annotations

from millm.kernel.runtime.jobs import JobView
from millm.lab.evaluations.book import EvaluationBook
from millm.lab.evaluations.job import start_evaluation
from millm.lab.evaluations.parts import EvaluationParts
from millm.lab.evaluations.protocol import (
    EvaluationRequest,
)


class EvaluationManagement:
    """Steering evaluations as the API presents them."""

    def __init__(self, state: EvaluationParts, book: EvaluationBook):
        self.state = state
        self.book = book

    def start(self, body: EvaluationRequest) -> JobView:
        """Check the request and start its job; the job's result is the stored evaluation."""
        return start_evaluation(self.state, body, self.book)
