"""/api/evaluations: start a steering evaluation (a job), read, export and delete the results."""

from __future__ import annotations

from millm.kernel.runtime.jobs import JobView
from millm.lab.evaluations.book import EvaluationBook
from millm.lab.evaluations.job import start_evaluation
from millm.lab.evaluations.parts import EvaluationParts
from millm.lab.evaluations.protocol import (
    EvaluationDeleted,
    EvaluationList,
    EvaluationRequest,
    EvaluationResult,
)


class EvaluationManagement:
    """Steering evaluations as the API presents them."""

    def __init__(self, state: EvaluationParts, book: EvaluationBook):
        self.state = state
        self.book = book

    def start(self, body: EvaluationRequest) -> JobView:
        """Check the request and start its job; the job's result is the stored evaluation."""
        return start_evaluation(self.state, body, self.book)

    def list(self) -> EvaluationList:
        """Every stored evaluation, newest first."""
        return self.book.list()

    def get(self, evaluation_id: str) -> EvaluationResult:
        """One stored evaluation whole."""
        return self.book.get(evaluation_id)

    def csv(self, evaluation_id: str) -> str:
        """One stored evaluation as CSV, one line per answer."""
        return self.book.csv(evaluation_id)

    def delete(self, evaluation_id: str) -> EvaluationDeleted:
        """Forget a stored evaluation."""
        return self.book.delete(evaluation_id)
