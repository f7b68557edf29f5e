"""Stop strings across token boundaries, with hold-back of text that could still become one."""

import pytest

from millm.engine.stopping import StopMatcher


def run(stops, deltas):
    matcher = StopMatcher(stops)
    emitted = []
    for delta in deltas:
        emitted.append(matcher.push(delta))
        if matcher.matched:
            break
    else:
        emitted.append(matcher.flush())
    return emitted, matcher.matched


@pytest.mark.parametrize(
    "stops, deltas, emitted, matched",
    [
        ([], ["a", "b"], ["a", "b", ""], None),
        (
            ["END"],
            ["hello ", "E", "N", "D", "more"],
            ["hello ", "", "", ""],
            "END",
        ),  # split across 3 tokens
        (["END"], ["hello E", "NX"], ["hello ", "ENX", ""], None),  # a false start is released
        (["END"], ["xxENDyy"], ["xx"], "END"),  # stop inside one token; text after it dropped
        (["\n\n", "."], ["a.b\n\n"], ["a"], "."),  # earliest stop wins
        (["ab", "b"], ["xab"], ["x"], "ab"),  # same text, earlier start wins
        (["<|end|>"], ["<|e", "n"], ["", "", "<|en"], None),  # held text flushed at the end
        (["aaa"], ["a", "a", "b"], ["", "", "aab", ""], None),
    ],
)
def test_stop_matching(stops, deltas, emitted, matched):
    got, got_matched = run(stops, deltas)
    assert got == emitted
    assert got_matched == matched


def test_nothing_after_a_match():
    matcher = StopMatcher(["x"])
    assert matcher.push("ax") == "a"
    assert matcher.push("more") == ""
