"""Labels from a calibration's top examples: each feature named by the tokens it fires hardest on.

The cheapest label there is, and the one a freshly trained dictionary can have at once, with no
explainer model: the tokens at a feature's largest activations, each weighted by the activations
it had, the three heaviest (told apart case-blind) joined as "pirate / ship / sea". It is the
original miLLM's and Neuronpedia's "top activating tokens", and what the demo dictionaries'
labels are. Only the calibration's top examples are read (up to 20 a feature, their snippets all
different), so a label is as good as the calibration's corpus.
"""

from __future__ import annotations

from collections.abc import Iterable

from millm.formats.labels import TOP_TOKENS, Label, LabelDocument
from millm.kernel.books.calibrations import FeatureFigures

WORDS = 3  # tokens in a label
TOKENS_KEPT = 10  # tokens listed beside it (`top_tokens`), heaviest first


def shown(token: str) -> str:
    """A token as a label shows it: stripped, or its repr when it is only white space."""
    return token.strip() or repr(token)


def heaviest_tokens(figures: FeatureFigures) -> list[str]:
    """The feature's top-example tokens, heaviest (summed activation) first; ties by first seen."""
    weight: dict[str, float] = {}
    for example in figures.top_examples:
        if example.activation > 0:
            weight[example.token] = weight.get(example.token, 0.0) + example.activation
    return sorted(weight, key=lambda token: -weight[token])  # stable: ties keep the first seen


def label_of(tokens: list[str]) -> str:
    """The first WORDS tokens that differ case-blind, shown and joined with " / "."""
    words: list[str] = []
    for token in tokens:
        word = shown(token)
        if word.lower() not in {w.lower() for w in words}:
            words.append(word)
        if len(words) == WORDS:
            break
    return " / ".join(words)


def top_token_label(figures: FeatureFigures) -> Label | None:
    """One feature's label with its top tokens, best example and figures beside it; None when it
    never fired in the calibration."""
    tokens = heaviest_tokens(figures)
    if not tokens:
        return None
    best = figures.top_examples[0]
    return Label(
        index=figures.index,
        label=label_of(tokens),
        detail={
            "top_tokens": tokens[:TOKENS_KEPT],
            "example": best.display,
            "frequency": figures.frequency,
            "max_activation": figures.max,
        },
    )


def top_token_document(figures: Iterable[FeatureFigures]) -> LabelDocument:
    """A labels document of every feature that fired (the others are `skipped`)."""
    labels: list[Label] = []
    skipped = 0
    for one in figures:
        label = top_token_label(one)
        if label is None:
            skipped += 1
        else:
            labels.append(label)
    return LabelDocument(format=TOP_TOKENS, labels=labels, skipped=skipped)
