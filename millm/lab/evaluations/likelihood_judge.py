"""The likelihood judge: AxBench's three ratings read from the unsteered model's likelihoods
rather than asked of it, for base models too small to answer a rating question.

Measured on the demo model (SmolLM2-135M): asked AxBench's concept question, it gives a plain
answer, a pirate answer and a wizard answer the same ratings within 0.03 (it does not judge);
its likelihoods tell them apart (a pirate answer is 0.15-0.17 nats per token likelier after a
system message asking for pirates than after a neutral one, the others 0.26-0.36 less likely).
So each rating is a posterior the model gives, on AxBench's 0-2 scale:

- concept: 2 x P(the answer was written after "Talk about <concept>" rather than after a neutral
  system message, both before its instruction), equal priors: the sigmoid of the answer's summed
  log-likelihood ratio;
- instruction: 2 x P(this instruction rather than another of the run's and the built-in ones),
  uniform prior: a softmax over the answer's summed log-likelihood after each instruction;
- fluency: 2 x min(1, the unsteered answers' mean perplexity / this answer's perplexity): as
  predictable as the model's own unsteered answers is fluent, twice as perplexing is 1.

Every pass is unsteered, on the scheduler thread (kernel/runtime/blocking.py).
"""

from __future__ import annotations

import math
import threading

from millm.engine.prompts import chat_prompt_ids
from millm.kernel.runtime.blocking import likelihoods_blocking
from millm.lab.evaluations.parts import EvaluationParts
from millm.lab.evaluations.scales import Answer, Ratings

CONCEPT_SYSTEM = "Talk about {concept} in every answer."
NEUTRAL_SYSTEM = "You are a helpful assistant."


def sigmoid(x: float) -> float:
    """1 / (1 + e^-x), without overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def posterior(scores: list[float], index: int) -> float:
    """softmax(scores)[index]."""
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    return weights[index] / sum(weights)


class LikelihoodJudge:
    """The loaded model's likelihoods as a judge."""

    def __init__(
        self, state: EvaluationParts, model: str, tokenizer, instructions: tuple[str, ...]
    ):
        self.state, self.model, self.tokenizer = state, model, tokenizer
        self.hypotheses = instructions

    def describe(self) -> dict:
        """How the result names its judge, with what its posteriors weigh."""
        return {
            "kind": "likelihood",
            "model": self.model,
            "concept_system": CONCEPT_SYSTEM,
            "neutral_system": NEUTRAL_SYSTEM,
            "instructions": list(self.hypotheses),  # what the instruction posterior is over
        }

    def rate(
        self, concept: str, answers: list[Answer], reference: float | None, cancel: threading.Event
    ) -> list[Ratings]:
        """Each answer's three posteriors, from two likelihood jobs."""
        goal = CONCEPT_SYSTEM.format(concept=concept)
        primed = [
            (self._prompt(system, a.instruction), a.tokens)
            for a in answers
            for system in (goal, NEUTRAL_SYSTEM)
        ]
        concept_sums = self._sums(primed, cancel)
        asked = [self._prompt(None, h) for h in self.hypotheses]
        instruction_sums = self._sums([(p, a.tokens) for a in answers for p in asked], cancel)
        ratings = []
        for i, answer in enumerate(answers):
            ratio = concept_sums[2 * i] - concept_sums[2 * i + 1]
            scores = instruction_sums[i * len(asked) : (i + 1) * len(asked)]
            own = self.hypotheses.index(answer.instruction)
            fluent = (
                min(1.0, reference / answer.perplexity)
                if reference is not None and answer.perplexity
                else 0.0
            )
            ratings.append((2 * sigmoid(ratio), 2 * posterior(scores, own), 2 * fluent))
        return ratings

    def _prompt(self, system: str | None, instruction: str) -> list[int]:
        """A chat prompt: the system message (if any), then the instruction."""
        messages = [{"role": "system", "content": system}] if system is not None else []
        return chat_prompt_ids(
            self.tokenizer, [*messages, {"role": "user", "content": instruction}]
        )

    def _sums(
        self, pairs: list[tuple[list[int], list[int]]], cancel: threading.Event
    ) -> list[float]:
        """Each answer's summed log-likelihood after its prompt (0 for an empty answer)."""
        scored = likelihoods_blocking(
            self.state.switch,
            self.model,
            [prompt + tokens for prompt, tokens in pairs],
            [len(prompt) for prompt, _ in pairs],
            cancel=cancel,
        )
        return [sum(row) for row in scored] if scored is not None else [0.0] * len(pairs)
