"""Contrast: the features of an attached SAE that best separate two sets of texts (Goodfire's
contrastive search, locally).

Each text gets one forward pass on the scheduler thread (unsteered unless the caller asks for a
plan, never monitored); there its dense activations are reduced to one value per feature, the
max or the mean over its read positions. The statistics (each set's mean, their difference and
Cohen's d, see interp/separation.py) are numpy work, made by `contrast_result` on a worker thread
for the route and on the job's own thread for `contrast_prompts_blocking` (AutoSteer): both share
that one function.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from millm.engine.jobs import ResidualRead, ScoresReady
from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit
from millm.errors import InvalidRequest
from millm.interp.separation import favouring, separation
from millm.interp.steering import Attached
from millm.kernel.runtime.blocking import passes_blocking
from millm.kernel.runtime.jobs import JobCancelled
from millm.lab.discovery.inputs import (
    MIN_TOKENS,
    check_total,
    label_of,
    set_prompts,
)
from millm.lab.discovery.parts import DiscoveryParts
from millm.lab.discovery.protocol import (
    Aggregate,
    ContrastFeature,
    ContrastRequest,
    SetRead,
)
from millm.lab.discovery.reads import discovery_read


@dataclass(frozen=True)
class ContrastResult:
    """The features that best separate set a from set b: top_k favouring each, strongest effect
    first."""

    sae_id: str
    aggregate: Aggregate
    texts_a: int
    texts_b: int
    favouring_a: list[ContrastFeature]
    favouring_b: list[ContrastFeature]


def aggregate_read(attached: Attached, aggregate: Aggregate) -> ResidualRead:
    """A discovery read that keeps, per text, each feature's max or mean over its read positions
    (numpy `[d_sae]`)."""

    def reduce(acts: torch.Tensor, positions: tuple[int, ...]) -> np.ndarray:
        return (acts.max(dim=0).values if aggregate == "max" else acts.mean(dim=0)).numpy()

    return discovery_read(attached, reduce)


def per_text(answered: ScoresReady, count: int) -> list[np.ndarray]:
    """Each prompt's aggregate, in prompt order."""
    by_row = {read.row: read.encoded for read in answered.reads}
    return [by_row[row] for row in range(count)]


def contrast_result(
    labels: Callable[[str], dict[int, dict]],
    sae_id: str,
    a: list[np.ndarray],
    b: list[np.ndarray],
    aggregate: Aggregate,
    top_k: int,
) -> ContrastResult:
    """The statistics of two sets of per-text aggregates and the top_k features favouring each
    (numpy; blocking: labels)."""
    set_a, set_b = np.stack(a), np.stack(b)
    found = separation(set_a, set_b)
    fired_a, fired_b = (set_a > 0).sum(axis=0), (set_b > 0).sum(axis=0)
    names = labels(sae_id)

    def entry(index: int) -> ContrastFeature:
        d = float(found.effect_size[index])
        return ContrastFeature(
            index=index,
            label=label_of(names, index),
            mean_a=float(found.mean_a[index]),
            mean_b=float(found.mean_b[index]),
            difference=float(found.difference[index]),
            effect_size=d if math.isfinite(d) else None,
            fired_a=int(fired_a[index]),
            fired_b=int(fired_b[index]),
        )

    for_a, for_b = favouring(found, top_k)
    return ContrastResult(
        sae_id,
        aggregate,
        len(a),
        len(b),
        [entry(int(i)) for i in for_a],
        [entry(int(i)) for i in for_b],
    )


def contrast_prompts_blocking(
    state: DiscoveryParts,
    model: str,
    attached: Attached,
    a: list[list[int]],
    b: list[list[int]],
    *,
    aggregate: Aggregate = "max",
    top_k: int = 20,
    edit: ResidualEdit | None = None,
    cancel: threading.Event | None = None,
) -> ContrastResult:
    """Contrast two sets of token-id prompts from a job's thread (one engine call under a lease on
    `model`); raises JobCancelled when `cancel` is set before the passes end, InvalidRequest for
    a prompt under 2 tokens."""
    for name, prompts in (("a", a), ("b", b)):
        for i, prompt in enumerate(prompts):
            if len(prompt) < MIN_TOKENS:
                raise InvalidRequest(
                    f"{name}[{i}] is {len(prompt)} token{'s' if len(prompt) != 1 else ''} long; a "
                    f"contrast text needs at least {MIN_TOKENS}",
                    param=f"{name}[{i}]",
                )
    if not a or not b:
        raise InvalidRequest(
            f"a contrast needs a text in each set, got {len(a)} and {len(b)}", param="b"
        )
    answered = passes_blocking(
        state.switch, model, a + b, (aggregate_read(attached, aggregate),), edit=edit, cancel=cancel
    )
    if answered is None:
        raise JobCancelled()
    values = per_text(answered, len(a) + len(b))
    return contrast_result(
        state.saes.labels, attached.info.id, values[: len(a)], values[len(a) :], aggregate, top_k
    )


def contrast_prompts(
    lm: LoadedModel, body: ContrastRequest, cap: int
) -> tuple[list[list[int]], list[list[int]], SetRead, SetRead]:
    """Both sets' token ids, each text readable, all within MILLM_DISCOVERY_MAX_TOKENS (blocking:
    tokenising)."""
    a, b = set_prompts(lm, "a", body.a), set_prompts(lm, "b", body.b)
    check_total(a + b, cap)
    ids_a, ids_b = [ids for _, ids in a], [ids for _, ids in b]
    return (
        ids_a,
        ids_b,
        SetRead(texts=len(a), tokens=sum(map(len, ids_a))),
        SetRead(texts=len(b), tokens=sum(map(len, ids_b))),
    )
