"""The vector-training job: each text of each pair read once, unsteered, at one residual point, and
the pairs' pooled differences turned into a stored steering vector (interp/vectors.py).

Checked before the job starts (on the route's worker thread): the name free, the pairs within
MILLM_DISCOVERY_MAX_TEXTS and their tokens within MILLM_DISCOVERY_MAX_TOKENS, every text readable
(within the context window, a position after the skipped first one), the layer within the
model. The job's thread never touches torch: each engine call (one text, or a few short ones)
goes to the scheduler thread through passes_blocking with a raw residual read whose `encode`
pools the text's residuals there, so only a d_model vector per text leaves it. Between calls the
job reports progress (unit: texts), yields to serving and looks for a cancel. A cancelled or
failed job stores nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from millm.engine.jobs import ResidualRead
from millm.engine.loader import LoadedModel
from millm.errors import Conflict, InvalidRequest, ModelNotLoaded
from millm.interp.steering import residual_point
from millm.interp.vectors import pooled, train
from millm.kernel.books.vectors import model_width
from millm.kernel.runtime.blocking import passes_blocking
from millm.kernel.runtime.jobs import JobHandle
from millm.lab.calibration.job import groups
from millm.lab.discovery.inputs import (
    check_readable,
    check_total,
    conversation_prompt,
    text_prompt,
)
from millm.lab.discovery.reads import SKIPPED_POSITIONS
from millm.lab.vectors.protocol import Side, TrainVectorRequest

if TYPE_CHECKING:
    from millm.lab.vectors.parts import VectorParts

TAG = "vectors"


@dataclass(frozen=True)
class PreparedTraining:
    """A checked request: the model, the point, and each text's token ids (positives, then
    negatives)."""

    body: TrainVectorRequest
    model: str
    d_model: int
    point: int
    texts: list[list[int]]


def side_ids(lm: LoadedModel, side: Side, param: str) -> list[int]:
    """One side of a pair as readable token ids: a text as a /v1/completions prompt, a
    conversation through the chat template."""
    ids = (
        text_prompt(lm, side, param)
        if isinstance(side, str)
        else conversation_prompt(lm, side, param)
    )
    return check_readable(lm, ids, param)


def prepare(state: VectorParts, body: TrainVectorRequest) -> PreparedTraining:
    """Everything the job needs, checked in the order a client would fix it (blocking:
    tokenising)."""
    cap = state.settings.discovery_max_texts
    if len(body.pairs) > cap:
        raise InvalidRequest(
            f"pairs holds {len(body.pairs)} pairs; a training takes at most {cap} "
            "(MILLM_DISCOVERY_MAX_TEXTS)",
            param="pairs",
        )
    if body.method == "pca" and len(body.pairs) < 2:
        raise InvalidRequest(
            "method pca needs at least 2 pairs (one difference has no principal direction of its "
            "own)",
            param="pairs",
        )
    if body.name in state.vectors.shelf.by_name:
        raise Conflict(
            f"a steering vector named {body.name!r} exists; choose another name",
            param="name",
            code="vector_exists",
        )
    lm = state.switch.lm
    if lm is None:
        raise ModelNotLoaded(
            "no model is loaded to read the pairs with; load one first", param="model"
        )
    if body.model is not None and body.model != lm.name:
        raise InvalidRequest(
            f"model {body.model!r} is not the loaded model ({lm.name!r}); load it first",
            param="model",
        )
    depth = int(lm.config.num_hidden_layers)
    if body.layer >= depth:
        raise InvalidRequest(
            f"layer {body.layer} does not exist in {lm.name}, which has {depth} layers "
            f"(0..{depth - 1})",
            param="layer",
        )
    entries = [
        (f"pairs[{i}].{which}", getattr(pair, which))
        for which in ("positive", "negative")
        for i, pair in enumerate(body.pairs)
    ]
    texts = [(param, side_ids(lm, side, param)) for param, side in entries]
    check_total(texts, state.settings.discovery_max_tokens)
    return PreparedTraining(
        body,
        lm.name,
        model_width(lm),
        residual_point(body.layer, body.hook_point),
        [ids for _, ids in texts],
    )


def read_pooled(state: VectorParts, prep: PreparedTraining, handle: JobHandle) -> np.ndarray:
    """Every text's pooled residual at the point `[texts, d_model]` (float64), a few texts per
    engine call."""
    read = ResidualRead(
        prep.point,
        False,
        "prompt",
        TAG,
        encode=lambda residuals: pooled(residuals, SKIPPED_POSITIONS),
    )
    out = np.zeros((len(prep.texts), prep.d_model))
    for group in groups(prep.texts):
        handle.check()
        began = time.monotonic()
        answered = passes_blocking(
            state.switch,
            prep.model,
            [prep.texts[i] for i in group],
            (read,),
            cancel=handle.cancel_event,
        )
        handle.check()
        assert answered is not None  # None only when cancelled, which check() raised for
        for captured in answered.reads:
            out[group[captured.row]] = captured.encoded
        handle.advance(len(group))
        handle.pace(time.monotonic() - began)
    return out


def run_training(state: VectorParts, prep: PreparedTraining, handle: JobHandle) -> dict:
    """The job: read, train (numpy), store; the stored vector is the result."""
    vectors = read_pooled(state, prep, handle)
    half = len(prep.body.pairs)
    trained = train(vectors[:half], vectors[half:], prep.body.method)
    handle.check()
    body = prep.body
    meta = {
        "name": body.name,
        "description": body.description,
        "model": prep.model,
        "d_model": prep.d_model,
        "layer": body.layer,
        "hook_point": body.hook_point,
        "method": body.method,
        "pairs": trained.pairs,
        "norm": trained.norm,
        "agreement": trained.agreement,
    }
    return state.vectors.view(state.vectors.create(meta, trained.unit)).model_dump()
