"""An explanation's scores, detection or fuzzing: delphi's confusion counts and balanced accuracy.

Each held-out text is a positive (detection: the feature fired in it; fuzzing: it is marked where
the feature fired) or a negative (a quiet text; fuzzing: one marked at random tokens); the scorer
says yes or no as a probability P("1") / (P("0") + P("1")) of its answer's token.
A text is predicted activating at 0.5 or above; a text the scorer gave no answer for is left out
and counted as `failed`, as delphi does. Balanced accuracy is the mean of the true-positive and
true-negative rates, so a scorer that says yes (or no) to everything scores 0.5. The AUC (delphi
reports it when it reads probabilities) ranks the probabilities instead of cutting them at 0.5: a
scorer biased towards yes that still gives the positives more weight scores above 0.5 there.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

CUT = 0.5


@dataclass(frozen=True)
class ScoredText:
    """One held-out text: whether the feature fired in it, and the scorer's probability of yes."""

    activating: bool
    probability: float | None  # None: no answer could be read


class BalancedScore(BaseModel):
    """How well the scorer, given the explanation, told the positives from the negatives."""

    balanced_accuracy: float
    true_positive_rate: float
    true_negative_rate: float
    auc: float | None  # ROC AUC of the probabilities (None without both kinds of text)
    texts: int  # judged (answered), activating and quiet together
    activating: int
    quiet: int
    failed: int  # texts without a readable answer, left out


def balanced_score(judged: list[ScoredText]) -> BalancedScore:
    """Balanced accuracy (and its parts) over the texts that got an answer."""
    # Imported here: sklearn.metrics (with SciPy and pandas) is 1.5 s of every server start
    # otherwise.
    from sklearn.metrics import roc_auc_score

    answered = [j for j in judged if j.probability is not None]
    positives = [j for j in answered if j.activating]
    negatives = [j for j in answered if not j.activating]
    tp = sum(1 for j in positives if j.probability is not None and j.probability >= CUT)
    tn = sum(1 for j in negatives if j.probability is not None and j.probability < CUT)
    tpr = tp / len(positives) if positives else 0.0
    tnr = tn / len(negatives) if negatives else 0.0
    auc = (
        float(roc_auc_score([j.activating for j in answered], [j.probability for j in answered]))
        if positives and negatives
        else None
    )
    return BalancedScore(
        balanced_accuracy=(tpr + tnr) / 2,
        auc=auc,
        true_positive_rate=tpr,
        true_negative_rate=tnr,
        texts=len(answered),
        activating=len(positives),
        quiet=len(negatives),
        failed=len(judged) - len(answered),
    )
