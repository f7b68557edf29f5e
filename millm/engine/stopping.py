"""Stop strings matched on text across token boundaries, with streaming hold-back.

Text that could still grow into a stop string is held back until it either completes one
(generation stops and the stop string never reaches the client) or cannot anymore.
"""

from __future__ import annotations


class StopMatcher:
    """Feeds decoded text deltas through; says what is safe to emit and whether a stop matched."""

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self._pending = ""
        self.matched: str | None = None

    def push(self, delta: str) -> str:
        """Add decoded text; return the part that can no longer belong to a stop string."""
        if not self.stops:
            return delta
        if self.matched is not None:
            return ""
        pending = self._pending + delta
        cut = self._earliest_stop(pending)
        if cut is not None:
            self._pending = ""
            return pending[:cut]
        hold = self._held_suffix_length(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return pending[: len(pending) - hold]

    def flush(self) -> str:
        """Release the held-back text when generation ends for another reason."""
        held, self._pending = self._pending, ""
        return held

    def _earliest_stop(self, text: str) -> int | None:
        # The stop completed first (earliest end, then the longest one ending there), as if the
        # text had come one character at a time: token boundaries must not change the answer.
        found = [(at + len(stop), at, stop) for stop in self.stops if (at := text.find(stop)) != -1]
        if not found:
            return None
        _, index, self.matched = min(found)
        return index

    def _held_suffix_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
