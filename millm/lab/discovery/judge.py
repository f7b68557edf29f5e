"""The unsteered model as a yes/no judge: does a text match a plain-language description?

The question goes through the chat template as a user turn, and the answer is the next-token
distribution over the spellings of yes and no that are one token (or, for a tokenizer with
none, the first tokens of the spellings), normalised over those alone,
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

QUESTION = (
    'Here is a text:\n\n"""\n{text}\n"""\n\nDoes this text match the description "{goal}"? '
    "Answer yes or no."
)
YES = ("Yes", "yes", " Yes", " yes", "YES")
NO = ("No", "no", " No", " no", "NO")


def answer_tokens(tokenizer, words: tuple[str, ...]) -> tuple[int, ...]:
    """The ids that start an answer of one of `words`: the spellings that are one token each, or,
    when the tokenizer has none, the first token of each spelling (no duplicates, in order)."""
    encoded = [tokenizer(word, add_special_tokens=False)["input_ids"] for word in words]
    singles = [ids[0] for ids in encoded if len(ids) == 1]
    chosen = singles or [ids[0] for ids in encoded if ids]
    return tuple(dict.fromkeys(chosen))


@dataclass(frozen=True)
class GoalJudge:
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


def judge_tokens(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The yes and no answer tokens; a token that could start both is left out of either."""
    yes, no = answer_tokens(tokenizer, YES), answer_tokens(tokenizer, NO)
    shared = set(yes) & set(no)
    return tuple(t for t in yes if t not in shared), tuple(t for t in no if t not in shared)


def judge_for(tokenizer, goal: str) -> GoalJudge:
    """A judge for `goal`, or 400 when the tokenizer cannot tell a yes from a no by the first
    token."""
    yes, no = judge_tokens(tokenizer)
    if not yes or not no:
        raise InvalidRequest(
            "this model's tokenizer starts 'yes' and 'no' with the same token, so it cannot judge "
            "AutoSteer's settings",
            param="goal",
        )
    return GoalJudge(goal, yes, no)
