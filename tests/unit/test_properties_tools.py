"""Properties of the streaming tool-call hold-back (CallHoldback), over random texts and deltas.

Under tool_choice "auto" the streamed content must never show any part of a `<tool_call>`
block, yet nothing the model wrote may be lost: what was streamed plus the final flush is the
whole text, and text is held only while it could still be the start of `<tool_call>`.
"""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from millm.v1.serving.answers_read import CallHoldback
from millm.v1.serving.tools import OPEN

# Pieces of the markup (and of near misses) make partial and complete openings frequent.
PIECES = [
    OPEN,
    "<tool_call",
    "<tool",
    "<",
    "tool_call>",
    "</tool_call>",
    "<tool_cal>",
    '{"name": "f"}',
    "a",
    " ",
    "\n",
    "é",
]


@st.composite
def streams(draw):
    """A text and the deltas it arrives in (random boundaries, empty deltas included)."""
    text = "".join(draw(st.lists(st.sampled_from(PIECES), max_size=10)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in pairwise(bounds)]


def held_length(text: str) -> int:
    """The longest suffix of `text` that is a proper prefix of OPEN: all that may be held back."""
    return max((k for k in range(1, len(OPEN)) if text.endswith(OPEN[:k])), default=0)


@given(streams())
def test_streamed_content_plus_flush_is_the_whole_text(case):
    text, deltas = case
    holdback = CallHoldback()
    assert "".join(holdback.push(delta) for delta in deltas) + holdback.flush() == text


@given(streams())
def test_no_part_of_the_call_markup_is_streamed_once_a_call_starts(case):
    text, deltas = case
    holdback = CallHoldback()
    streamed = "".join(holdback.push(delta) for delta in deltas)
    at = text.find(OPEN)
    if at == -1:
        assert not holdback.calling
        return
    # Content is exactly what came before the call: not one character of "<tool_call>" or after.
    assert holdback.calling and streamed == text[:at]
    assert holdback.flush() == text[at:]


@given(streams())
def test_before_a_call_only_a_possible_start_of_the_markup_is_held(case):
    text, deltas = case
    holdback = CallHoldback()
    seen, streamed = "", ""
    for delta in deltas:
        seen += delta
        streamed += holdback.push(delta)
        if OPEN in seen:
            return
        assert streamed == seen[: len(seen) - held_length(seen)]
