"""Who rates the answers on AxBench's questions: the loaded model, unsteered, or a remote
OpenAI-compatible judge (the likelihood judge, which reads the model's likelihoods instead of
asking it, is likelihood_judge.py).

The rating judge asks each question (scales.py) through the chat template and reads the next
token's distribution over the digits 0, 1 and 2 through the scoring path (never steered, so the
judge cannot be swayed by the steering it rates). The remote judge asks POST
{base}/chat/completions for one token with top_logprobs and reads the digits among them; a
server that sends no logprobs is read by the digit its answer starts with. A rating the judge
could not give (no digit at all: a remote judge only) counts as 0, as AxBench's parser does.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from typing import Protocol

import httpx

from millm.engine.jobs import Ranking
from millm.engine.prompts import chat_prompt_ids
from millm.errors import InvalidRequest
from millm.kernel.runtime.blocking import passes_blocking
from millm.kernel.runtime.remote import post_json
from millm.lab.evaluations.likelihood_judge import LikelihoodJudge
from millm.lab.evaluations.parts import EvaluationParts
from millm.lab.evaluations.scales import (
    DIGITS,
    PROMPTS,
    Answer,
    Ratings,
    expected_rating,
    questions,
)

REMOTE_TIMEOUT_S = 60.0
REMOTE_TOP = 20  # OpenAI's most alternatives per token


def digit_tokens(tokenizer) -> tuple[int, ...]:
    """The ids of 0, 1 and 2 when each is one token of its own; 400 naming `judge` otherwise."""
    ids = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in DIGITS]
    if any(len(one) != 1 for one in ids) or len({one[0] for one in ids}) != len(DIGITS):
        raise InvalidRequest(
            "this model's tokenizer does not spell 0, 1 and 2 as one token each, so it cannot "
            "rate on AxBench's scale; use judge: remote",
            param="judge",
        )
    return tuple(one[0] for one in ids)


class Judge(Protocol):
    """Rates answers for a concept on AxBench's three 0-2 scales."""

    def describe(self) -> dict:
        """How the result names the judge."""
        ...

    def rate(
        self, concept: str, answers: list[Answer], reference: float | None, cancel: threading.Event
    ) -> list[Ratings]:
        """Each answer's three ratings (`reference`: the unsteered answers' mean perplexity)."""
        ...


class DigitJudge(ABC):
    """A judge that answers AxBench's three questions per answer with a digit."""

    @abstractmethod
    def digits(self, questions: list[str], cancel: threading.Event) -> list[float | None]:
        """Each question's expected rating (None: no digit had any weight)."""

    def rate(
        self, concept: str, answers: list[Answer], reference: float | None, cancel: threading.Event
    ) -> list[Ratings]:
        """The three questions of every answer, asked in one go."""
        asked = [questions(concept, a.instruction, a.text) for a in answers]
        rated = self.digits([q[name] for q in asked for name in PROMPTS], cancel)
        values = [r or 0.0 for r in rated]
        return [(values[3 * i], values[3 * i + 1], values[3 * i + 2]) for i in range(len(answers))]


class ModelJudge(DigitJudge):
    """The loaded model answering the rating questions itself."""

    def __init__(self, state: EvaluationParts, model: str, tokenizer):
        self.state, self.model, self.tokenizer = state, model, tokenizer
        self.digit_ids = digit_tokens(tokenizer)

    def describe(self) -> dict:
        """How the result names its judge."""
        return {"kind": "rating", "model": self.model}

    def digits(self, questions: list[str], cancel: threading.Event) -> list[float | None]:
        """Each question's expected rating, in one scoring job."""
        prompts = [
            chat_prompt_ids(self.tokenizer, [{"role": "user", "content": q}]) for q in questions
        ]
        ranking = Ranking(self.digit_ids, 0.0, None)
        answered = passes_blocking(
            self.state.switch, self.model, prompts, ranking=ranking, cancel=cancel
        )
        if answered is None:
            return [None] * len(questions)
        by_id = dict(zip(self.digit_ids, DIGITS, strict=True))
        return [
            expected_rating({by_id[t]: math.exp(lp) for t, lp in scored.ranked if t in by_id})
            for scored in answered.scored
        ]


class RemoteJudge(DigitJudge):
    """An OpenAI-compatible chat completions server the operator configured."""

    def __init__(self, base_url: str, model: str, api_key: str | None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def describe(self) -> dict:
        """How the result names its judge (never its key)."""
        return {"kind": "remote", "model": self.model, "url": self.url}

    def digits(self, questions: list[str], cancel: threading.Event) -> list[float | None]:
        """Each question's expected rating, one request at a time."""
        ratings: list[float | None] = []
        with httpx.Client(timeout=REMOTE_TIMEOUT_S, headers=self.headers) as client:
            for question in questions:
                if cancel.is_set():
                    break
                ratings.append(self._one(client, question))
        return ratings + [None] * (len(questions) - len(ratings))

    def _one(self, client: httpx.Client, question: str) -> float | None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": REMOTE_TOP,
        }
        return read_remote(post_json(client, self.url, body, "remote judge"))


def read_remote(answer: dict) -> float | None:
    """The expected rating in a chat completion: over the digits among the first token's
    top_logprobs, else the digit the answer starts with."""
    choice = (answer.get("choices") or [{}])[0]
    entries = ((choice.get("logprobs") or {}).get("content")) or []
    if entries:
        probabilities: dict[str, float] = {}
        for alternative in entries[0].get("top_logprobs") or []:
            token = str(alternative.get("token", "")).strip()
            if token in DIGITS:
                probabilities[token] = probabilities.get(token, 0.0) + math.exp(
                    alternative["logprob"]
                )
        rating = expected_rating(probabilities)
        if rating is not None:
            return rating
    text = str((choice.get("message") or {}).get("content") or "").strip()
    return float(text[0]) if text[:1] in DIGITS else None


def judge_for(
    state: EvaluationParts, body_judge: str, model: str, tokenizer, instructions: tuple[str, ...]
) -> Judge:
    """The judge a request asked for: the model's likelihoods, the model's ratings, or the
    configured remote one (400 naming `judge` when none is)."""
    if body_judge == "likelihood":
        return LikelihoodJudge(state, model, tokenizer, instructions)
    if body_judge == "rating":
        return ModelJudge(state, model, tokenizer)
    settings = state.settings
    if not settings.judge_base_url or not settings.judge_model:
        raise InvalidRequest(
            "no remote judge is configured on this server (MILLM_JUDGE_BASE_URL and "
            "MILLM_JUDGE_MODEL)",
            param="judge",
        )
    return RemoteJudge(settings.judge_base_url, settings.judge_model, settings.judge_api_key)
