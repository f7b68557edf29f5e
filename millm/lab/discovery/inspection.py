"""Inspect: which features of an attached SAE fire on one text or conversation, and where.

One forward pass on the scheduler thread (unsteered unless the caller asks for a plan, never
monitored) reads every position but the first; there each feature's max, sum, firing count and
peak position are reduced to numpy arrays of the SAE's width, and the asked feature's
activation at every read position is kept. The ranking, the labels (a store read) and the token
strings are made on a worker thread; nothing here runs torch or the store on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from millm.engine.loader import LoadedModel
from millm.interp.steering import Attached
from millm.lab.discovery.inputs import (
    ReadSteering,
    check_readable,
    check_total,
    conversation_prompt,
    label_of,
    text_prompt,
)
from millm.lab.discovery.parts import DiscoveryParts
from millm.lab.discovery.protocol import (
    FeatureTrace,
    FeatureValue,
    InspectFeature,
    InspectRequest,
    InspectResponse,
    ReadOne,
    SteeringUsed,
    TokenRead,
)


@dataclass(frozen=True)
class Summary:
    """Per feature over the read positions: max, mean, positions fired at, peak position; and the
    asked feature's values."""

    positions: tuple[int, ...]
    max: np.ndarray
    mean: np.ndarray
    count: np.ndarray
    peak: np.ndarray
    trace: np.ndarray | None


def summarise(feature: int | None):
    """The scheduler-thread reduction of a text's dense activations `[n, d_sae]` to a Summary."""

    def reduce(acts: torch.Tensor, positions: tuple[int, ...]) -> Summary:
        top = acts.max(dim=0)
        return Summary(
            positions=positions,
            max=top.values.numpy(),
            mean=acts.mean(dim=0).numpy(),
            count=(acts > 0).sum(dim=0).numpy(),
            peak=(top.indices + positions[0]).numpy(),
            trace=acts[:, feature].clone().numpy() if feature is not None else None,
        )

    return reduce


def ranked(summary: Summary, sort: str, top_k: int) -> np.ndarray:
    """The indices of the features that fired, top_k by `sort` (ties: the larger max, then the
    lower index)."""
    fired = np.flatnonzero(summary.count > 0)
    key = {"max": summary.max, "mean": summary.mean, "count": summary.count}[sort][fired]
    # lexsort: the last key is the primary one
    order = np.lexsort((fired, -summary.max[fired], -key))
    return fired[order][:top_k]


def token_strings(lm: LoadedModel, ids: list[int]) -> list[str]:
    """Each token decoded on its own (special tokens by name)."""
    return lm.tokenizer.batch_decode(
        [[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def inspection_answer(
    state: DiscoveryParts,
    lm: LoadedModel,
    attached: Attached,
    prompt: list[int],
    summary: Summary,
    body: InspectRequest,
    steered: ReadSteering,
) -> InspectResponse:
    """The response: ranking, labels and token strings (blocking: labels may come from the
    store)."""
    labels = state.saes.labels(attached.info.id)
    strings = token_strings(lm, prompt)
    features = [
        InspectFeature(
            index=int(i),
            label=label_of(labels, int(i)),
            max=float(summary.max[i]),
            mean=float(summary.mean[i]),
            count=int(summary.count[i]),
            max_position=int(summary.peak[i]),
        )
        for i in ranked(summary, body.sort, body.top_k)
    ]
    trace = None
    if body.feature is not None and summary.trace is not None:
        values = [
            FeatureValue(position=p, token=strings[p], value=float(v))
            for p, v in zip(summary.positions, summary.trace.tolist(), strict=True)
        ]
        trace = FeatureTrace(
            index=body.feature, label=label_of(labels, body.feature), values=values
        )
    return InspectResponse(
        model=lm.name,
        sae_id=attached.info.id,
        layer=attached.layer,
        sort=body.sort,
        steered=steered.edit is not None,
        steering=SteeringUsed(kind=steered.kind, params=steered.params),
        prompt_tokens=len(prompt),
        tokens=[
            TokenRead(position=p, token_id=prompt[p], token=strings[p]) for p in summary.positions
        ],
        features=features,
        activations=trace,
    )


def inspect_prompt(lm: LoadedModel, body: ReadOne, cap: int) -> list[int]:
    """The text's or conversation's token ids, readable and within MILLM_DISCOVERY_MAX_TOKENS."""
    param = "text" if body.text is not None else "messages"
    ids = (
        text_prompt(lm, body.text, param)
        if body.text is not None
        else conversation_prompt(lm, body.messages or [], param)
    )
    check_readable(lm, ids, param)
    check_total([(param, ids)], cap)
    return ids
