"""AxBench's three ratings on its 0-2 scale, asked as questions a judge answers with one digit.

A judge that reports probabilities (the loaded model through the scoring path; a remote judge
with top_logprobs) is read as the expected rating, sum(k * P(k)) over the digits 0, 1 and 2
normalised over those three alone, so a judge unsure between 1 and 2 says 1.5 rather than a coin
flip. The harmonic mean of an answer's three ratings is AxBench's aggregate: a steering that
brings in the concept but loses the instruction or fluency scores near 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DIGITS = ("0", "1", "2")
Ratings = tuple[float, float, float]  # concept, instruction, fluency, each 0-2


@dataclass(frozen=True)
class Answer:
    """One answer to rate: its instruction, its text and tokens, and its perplexity."""

    instruction: str
    text: str
    tokens: list[int]
    perplexity: float | None


CONCEPT = (
    'Text: """{text}"""\n\nHow much is this text about {concept}? 0 = not at all, 1 = in passing, '
    "2 = clearly and throughout. Answer with one digit: 0, 1 or 2."
)
INSTRUCTION = (
    'Instruction: """{instruction}"""\n\nResponse: """{text}"""\n\nHow well does the response '
    "answer the instruction, whatever else it says? 0 = unrelated, 1 = partly, 2 = fully. "
    "Answer with one digit: 0, 1 or 2."
)
FLUENCY = (
    'Text: """{text}"""\n\nHow fluent is this text: well-formed language, without repetition '
    "or broken words? 0 = not fluent, 1 = somewhat, 2 = fluent. Answer with one digit: 0, 1 or 2."
)
PROMPTS = {"concept": CONCEPT, "instruction": INSTRUCTION, "fluency": FLUENCY}


def questions(concept: str, instruction: str, text: str) -> dict[str, str]:
    """The three questions about one answer, by rating."""
    fields = {"concept": concept, "instruction": instruction, "text": text.strip() or "(empty)"}
    return {name: prompt.format(**fields) for name, prompt in PROMPTS.items()}


def expected_rating(probabilities: dict[str, float]) -> float | None:
    """sum(k * P(k)) over the digits, normalised over them; None when the judge gave none of them
    any mass."""
    total = sum(probabilities.get(d, 0.0) for d in DIGITS)
    if total <= 0 or not math.isfinite(total):
        return None
    return sum(int(d) * probabilities.get(d, 0.0) for d in DIGITS) / total


def harmonic_mean(values: list[float]) -> float:
    """The harmonic mean (0 when any value is 0)."""
    if any(v <= 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)
