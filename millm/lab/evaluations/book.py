"""Stored evaluations: listed newest first, read whole, exported as JSON or CSV, deleted.

Results are read from the store each time (they are not on any request's path), so every
replica sees each one as soon as it is written. At most MAX_STORED are kept: a new evaluation
past that is refused before it starts (409 evaluations_full) rather than one being dropped.
"""

from __future__ import annotations

import csv
import io

from millm.errors import Conflict, NotFound
from millm.lab.evaluations.protocol import (
    EvaluationDeleted,
    EvaluationList,
    EvaluationResult,
    EvaluationSummary,
)
from millm.store.database import Store
from millm.store.evaluations import (
    count_evaluations,
    delete_evaluation,
    evaluation_result,
    evaluation_results,
    insert_evaluation,
)

MAX_STORED = 200
CSV_COLUMNS = (
    "evaluation",
    "candidate",
    "kind",
    "strength",
    "instruction_index",
    "instruction",
    "text",
    "concept",
    "instruction_score",
    "fluency",
    "harmonic_mean",
    "perplexity",
)


class EvaluationBook:
    """The evaluations' results in the store."""

    def __init__(self, store: Store, limit: int = MAX_STORED):
        self.store, self.limit = store, limit

    def check_room(self) -> None:
        """409 evaluations_full when no more can be kept."""
        if count_evaluations(self.store) >= self.limit:
            raise Conflict(
                f"{self.limit} evaluations are stored, the most this server keeps; delete one "
                "first",
                code="evaluations_full",
            )

    def save(self, result: EvaluationResult) -> None:
        """Store a finished (or cancelled) evaluation."""
        insert_evaluation(self.store, result.model_dump(mode="json"))

    def list(self) -> EvaluationList:
        """Every stored evaluation, newest first, with its ranking."""
        results = evaluation_results(self.store)  # a summary's model ignores the rest of each
        return EvaluationList(data=[EvaluationSummary.model_validate(r) for r in results])

    def get(self, evaluation_id: str) -> EvaluationResult:
        """One evaluation whole; 404 evaluation_not_found."""
        found = evaluation_result(self.store, evaluation_id)
        if found is None:
            raise NotFound(
                f"no evaluation with id {evaluation_id!r}", param="id", code="evaluation_not_found"
            )
        return EvaluationResult.model_validate(found)

    def delete(self, evaluation_id: str) -> EvaluationDeleted:
        """Forget one; 404 when there is none."""
        if not delete_evaluation(self.store, evaluation_id):
            raise NotFound(
                f"no evaluation with id {evaluation_id!r}", param="id", code="evaluation_not_found"
            )
        return EvaluationDeleted(id=evaluation_id)

    def csv(self, evaluation_id: str) -> str:
        """One line per answer: the candidate, its strength, the instruction, the text and its
        scores."""
        result = self.get(evaluation_id)
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        lines = [("unsteered", "unsteered", result.baseline)] if result.baseline else []
        lines += [(c.label, c.kind, p) for c in result.candidates for p in c.points]
        for label, kind, point in lines:
            assert point is not None
            for sample in point.samples:
                writer.writerow(
                    (
                        result.id,
                        label,
                        kind,
                        "" if point.strength is None else point.strength,
                        sample.instruction,
                        result.instructions[sample.instruction],
                        sample.text,
                        sample.concept,
                        sample.instruction_score,
                        sample.fluency,
                        sample.harmonic_mean,
                        "" if sample.perplexity is None else sample.perplexity,
                    )
                )
        return out.getvalue()
