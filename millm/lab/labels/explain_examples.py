"""A feature's examples for explaining and scoring it, chosen as EleutherAI's delphi chooses them.

Every text of the calibration corpus is cut into windows of `width` tokens (consecutive, not
overlapping, the text's tail shorter); a window's activation is the feature's largest in it.
The explainer sees the `top` windows (largest first; ties: the earlier text and position). The
scorer sees held-out windows: the remaining activating windows split into `quantiles` bins of
equal count by activation, `per_quantile` drawn from each (seeded), and as many windows where the
feature never fired, drawn the same way. So the top windows are exactly where the calibration
found the feature's largest activations, and the scorer is tested on the feature's whole range,
weak firings included, not on the examples the explanation was written from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Window:
    """`width` tokens of one corpus text and the feature's activation at each."""

    text: int  # index of the text in the corpus
    start: int  # position of the first token in the text
    tokens: tuple[int, ...]
    activations: tuple[float, ...]

    @property
    def peak(self) -> float:
        """The feature's largest activation in the window."""
        return max(self.activations)


@dataclass(frozen=True)
class Examples:
    """A feature's windows: what the explainer reads, what the scorer is tested on."""

    top: list[Window]
    activating: list[Window]  # held out: quantile-sampled, never among `top`
    quiet: list[Window]  # windows where the feature is 0 at every token


def windows(text: int, ids: np.ndarray, activations: np.ndarray, width: int) -> list[Window]:
    """A text's consecutive windows of `width` tokens (the last may be shorter); `activations[i]`
    is the feature's activation at token i (0 where it was not read)."""
    return [
        Window(
            text,
            start,
            tuple(int(t) for t in ids[start : start + width]),
            tuple(float(a) for a in activations[start : start + width]),
        )
        for start in range(0, len(ids), width)
    ]


def fuzzed_marks(window: Window, count: int, rng: np.random.Generator) -> list[bool]:
    """`count` distinct tokens of a quiet window, drawn at random, to mark as if the feature fired
    there (fewer when the window is shorter)."""
    picked = set(rng.choice(len(window.tokens), size=min(count, len(window.tokens)), replace=False))
    return [i in picked for i in range(len(window.tokens))]


def marks_per_window(activating: list[Window]) -> int:
    """How many tokens a fuzzed window gets: the mean count of firing tokens per activating window,
    rounded up, as delphi's fuzzing scorer counts them."""
    if not activating:
        return 0
    return math.ceil(
        sum(sum(1 for a in w.activations if a != 0) for w in activating) / len(activating)
    )


def choose(
    all_windows: list[Window],
    *,
    top: int,
    quantiles: int,
    per_quantile: int,
    seed: int,
) -> Examples:
    """The top windows, then quantile samples of the other activating windows and as many quiet
    ones."""
    firing = [w for w in all_windows if w.peak > 0]
    order = sorted(range(len(firing)), key=lambda i: (-firing[i].peak, i))
    chosen = [firing[i] for i in order[:top]]
    rest = [firing[i] for i in sorted(order[top:], key=lambda i: (firing[i].peak, i))]
    rng = np.random.default_rng(seed)
    activating: list[Window] = []
    for part in np.array_split(np.arange(len(rest)), quantiles) if rest else []:
        picked = rng.choice(part, size=min(per_quantile, len(part)), replace=False)
        activating += [rest[i] for i in sorted(picked)]
    quiet_pool = [w for w in all_windows if w.peak <= 0]
    count = min(len(activating), len(quiet_pool))
    quiet = [quiet_pool[i] for i in sorted(rng.choice(len(quiet_pool), size=count, replace=False))]
    return Examples(chosen, activating, quiet)
