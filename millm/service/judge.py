"""The unsteered model as a yes/no judge: does a text match a plain-language description?

The question goes through the chat template as a user turn, and the answer is the next-token
distribution over the single-token spellings of yes and no (normalised over those alone),
through the scoring path: a scoring pass is never steered, so the judge cannot be swayed by
the steering it judges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from millm.engine.jobs import Ranking
from millm.engine.prompts import chat_prompt_ids, render_chat
from millm.engine.scoring import Scored
from millm.errors import InvalidRequest

QUESTION = 'Here is a text:\n\n"""\n{text}\n"""\n\nDoes this text match the description "{goal}"? Answer yes or no.'
YES = ("Yes", "yes", " Yes", " yes", "YES")
NO = ("No", "no", " No", " no", "NO")


def single_tokens(tokenizer, words: tuple[str, ...]) -> tuple[int, ...]:
    """The ids of the words that are one token each, without duplicates, in order."""
    ids: list[int] = []
    for word in words:
        encoded = tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(encoded) == 1 and encoded[0] not in ids:
            ids.append(encoded[0])
    return tuple(ids)


@dataclass(frozen=True)
class Judge:
    """A goal and the yes/no token ids of one tokenizer."""

    goal: str
    yes: tuple[int, ...]
    no: tuple[int, ...]

    @property
    def ranking(self) -> Ranking:
        """Rank only the yes and no tokens, logits unscaled."""
        return Ranking(self.yes + self.no, 0.0, None)

    def question(self, text: str) -> list[dict]:
        """The conversation that asks whether `text` matches the goal."""
        return [{"role": "user", "content": QUESTION.format(text=text.strip(), goal=self.goal)}]

    def prompt_ids(self, tokenizer, text: str) -> list[int]:
        """The question's token ids, through the chat template."""
        return chat_prompt_ids(tokenizer, self.question(text))

    def shown_prompt(self, tokenizer) -> str:
        """The rendered question with a placeholder text, for the result."""
        return render_chat(tokenizer, self.question("<text>"))

    def p_yes(self, scored: Scored) -> float:
        """P(yes) among the yes and no tokens."""
        return sum(math.exp(logprob) for token_id, logprob in scored.ranked if token_id in self.yes)


def judge_for(tokenizer, goal: str) -> Judge:
    """A judge for `goal`, or 400 when the tokenizer spells yes or no with more than one token."""
    yes, no = single_tokens(tokenizer, YES), single_tokens(tokenizer, NO)
    if not yes or not no:
        raise InvalidRequest(
            "this model's tokenizer has no single-token 'yes' or 'no', so it cannot judge AutoSteer's settings", param="goal"
        )
    return Judge(goal, yes, no)
