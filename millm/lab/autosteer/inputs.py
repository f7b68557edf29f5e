"""What an AutoSteer job starts from: its default probe prompts and neutral texts, the words of
a goal worth searching labels for, the prompts primed with the goal and with a neutral system
message, and the request as checked before the job starts (PreparedAutoSteer)."""

from __future__ import annotations

from dataclasses import dataclass

from millm.engine.prompts import chat_prompt_ids
from millm.interp.steering import Attached
from millm.lab.autosteer.protocol import (
    AutoSteerRequest,
)
from millm.lab.discovery.judge import GoalJudge

DEFAULT_PROBES = ("Tell me about your weekend.", "What is your favourite hobby?")
# Everyday sentences with no particular topic, for contrasting examples when none are given.
NEUTRAL_TEXTS = (
    "The meeting was moved to Thursday afternoon.",
    "Please remember to bring the forms signed by Friday.",
    "She opened the window because the room was warm.",
    "The report has three sections and an appendix.",
    "He walked to the station and caught the early train.",
    "Our office is on the second floor, next to the lift.",
    "The package should arrive within five working days.",
    "They painted the kitchen a light shade of grey.",
    "I need to update the spreadsheet before lunch.",
    "The library closes at six on weekdays.",
    "We talked about the schedule for next month.",
    "The printer on this floor is out of paper again.",
)
SKIPPED_POSITIONS = 1  # the attention sink (see lab/discovery/reads.py)
# Affinity: how much likelier the unsteered model finds an answer when told the goal than when
# told something neutral (a pointwise mutual information per token). The neutral message cancels
# what any system message does to an answer's likelihood.
GOAL_SYSTEM = "You {goal}."
# Words that say how to steer rather than what towards ("talk about Italian food"): left out of
# the label search, where "talk" found a "me / talk / chat" feature ahead of the food ones on the
# demo SAE.
INSTRUCTION_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "about",
        "like",
        "more",
        "less",
        "always",
        "often",
        "be",
        "sound",
        "sounds",
        "talk",
        "talks",
        "speak",
        "speaks",
        "write",
        "writes",
        "answer",
        "answers",
        "respond",
        "reply",
        "in",
        "on",
        "of",
        "and",
        "or",
        "to",
        "with",
        "as",
        "style",
        "way",
        "tone",
        "mention",
        "mentions",
        "discuss",
        "discusses",
        "use",
        "uses",
        "you",
        "your",
    ]
)


def search_words(goal: str) -> str:
    """The goal without its instruction words, for the label search (the goal itself when nothing
    else is left)."""
    kept = [
        word for word in goal.split() if word.lower().strip(".,!?;:'\"") not in INSTRUCTION_WORDS
    ]
    return " ".join(kept) or goal


CONTROL_SYSTEM = "You are a helpful assistant."


def primed_ids(tokenizer, system: str, probe: str) -> list[int]:
    """A probe prompt's token ids after a system message."""
    return chat_prompt_ids(
        tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": probe}]
    )


@dataclass(frozen=True)
class PreparedAutoSteer:
    """What the job needs, checked before it starts."""

    body: AutoSteerRequest
    model: str
    attached: Attached
    judge: GoalJudge
    probes: tuple[str, ...]
    probe_ids: tuple[tuple[int, ...], ...]
    goal_ids: tuple[tuple[int, ...], ...]  # each probe after a system message stating the goal
    control_ids: tuple[tuple[int, ...], ...]  # each probe after a neutral system message
    tokenizer: object
