"""Training a linear probe from labelled texts, as a job: residuals read, fitted, measured, stored.

What one example is. Every position of a text but the first (the attention sink, see
lab/discovery/reads.py) is an example, labelled with its text's class, and weighted 1 / (the text's
positions) so that each text counts once however long it is. The other choice, one example per
text (its mean residual), fits a classifier of whole texts; but a probe runs per position (a
Watch scores every position a row feeds), and a text-level fit says nothing about single
positions: on the demo model, trained on the same 16 conversations (pirate answers against plain
ones), a mean-pooled probe told a new plain answer from a pirate one as texts (0.07 against 0.93)
but fired at 23 positions of the plain one, chat template included; the per-position fit fired
at 4, and at p >= 0.9 at 8 positions of the pirate answer (" pirate", " ship", " sailing", " seas"
among them) and 1 of the plain one. Positions shared by both classes (the chat
template, "the") get both labels and end up near the base rate, as a per-position detector
should. The split is by text, never by position: positions of one text are never on both sides.

How it is fitted. A seeded, stratified split keeps `held_out` of the texts out of the fit
(scikit-learn's train_test_split: each class on both sides); on the training texts' positions, a
StandardScaler and scikit-learn's LogisticRegression (L2, C = 1, lbfgs, the weights above). The
scaler is folded into the stored weights (w = coef / scale, b = intercept - Σ coef · mean /
scale), so the probe reads the raw residual. Measured with the stored weights and threshold on
the held-out texts (sklearn.metrics), as the probe is used: `accuracy` is how often its verdict
(fired: some position's probability at or above the threshold) matches the text's class, `auc`
ranks the texts by their largest probability; `position_accuracy` and `position_auc` are over
every held-out position, labelled by its text.

Where it runs. The route checks and tokenises (a worker thread); the job's thread submits the
forward passes (unsteered, never monitored) to the scheduler thread through passes_blocking,
whose reads hand back each text's residuals as numpy; the fit is numpy and scikit-learn on the
job's thread, with their thread pools held to one thread (an idle pool on another live thread
slows every decode step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from millm.engine.jobs import ResidualRead
from millm.errors import InvalidRequest
from millm.formats.detectors import HookPoint
from millm.formats.document_schemas import MAX_DESCRIPTION, ProfileName
from millm.kernel.probes.book import probe_view
from millm.kernel.runtime.blocking import passes_blocking
from millm.kernel.runtime.jobs import JobCancelled, JobHandle
from millm.lab.calibration.job import GROUP_TOKENS, groups
from millm.lab.discovery.protocol import TextSet
from millm.lab.discovery.reads import SKIPPED_POSITIONS
from millm.lab.probes.parts import ProbeParts

MIN_PER_CLASS = 2  # one text of each class in the fit and one in the held-out part
TAG = "probe-training"


class ProbeTrainRequest(BaseModel):
    """POST /api/probes/train: positive and negative texts (or conversations), where to read, the
    probe's name."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: ProfileName
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] | None = None
    positive: TextSet = Field(description="Texts (or conversations) the probe should fire on.")
    negative: TextSet = Field(description="Texts (or conversations) it should not fire on.")
    sae_id: str | None = Field(
        None, description="Read where this attached SAE reads (its layer and hook point)."
    )
    layer: Annotated[int, Field(ge=0)] | None = Field(
        None, description="Or read at this layer (with hook_point)."
    )
    hook_point: HookPoint | None = Field(
        None, description="resid_post (default) or resid_pre, with layer."
    )
    held_out: Annotated[float, Field(ge=0.1, le=0.5)] = Field(
        0.25, description="Fraction of the texts kept out of the fit to measure it."
    )
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = Field(
        0, description="Seeds the held-out split."
    )
    threshold: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.5, description="The probability at which the stored probe fires."
    )

    @model_validator(mode="after")
    def _one_place(self) -> ProbeTrainRequest:
        if (self.sae_id is None) == (self.layer is None):
            raise InvalidRequest(
                "give sae_id (read where that SAE reads) or layer (and hook_point), one of them",
                param="layer",
            )
        if self.hook_point is not None and self.layer is None:
            raise InvalidRequest(
                "hook_point goes with layer (an SAE brings its own)", param="hook_point"
            )
        return self


@dataclass(frozen=True)
class ProbeExamples:
    """What the job reads: each text's token ids, its class (1 positive, 0 negative), and the
    split."""

    prompts: list[list[int]]
    labels: np.ndarray  # int, 1 for positive
    train: np.ndarray  # indices into prompts
    test: np.ndarray
    positives: int


def check_sizes(body: ProbeTrainRequest, cap: int) -> None:
    """Each class within MILLM_DISCOVERY_MAX_TEXTS and at least MIN_PER_CLASS (400 naming the
    set)."""
    for name, texts in (("positive", body.positive), ("negative", body.negative)):
        if texts.size > cap:
            raise InvalidRequest(
                f"{name}.{texts.field} holds {texts.size} entries; a class takes at most {cap} "
                "(MILLM_DISCOVERY_MAX_TEXTS)",
                param=f"{name}.{texts.field}",
            )
        if texts.size < MIN_PER_CLASS:
            raise InvalidRequest(
                f"{name}.{texts.field} holds {texts.size} "
                f"entr{'y' if texts.size == 1 else 'ies'}; a probe needs at least {MIN_PER_CLASS} "
                "of each class "
                "(one to fit and one held out to measure it)",
                param=f"{name}.{texts.field}",
            )


def split(labels: np.ndarray, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The seeded stratified split (train, held-out indices); a 400 when these counts cannot have
    both classes on both sides."""
    from sklearn.model_selection import train_test_split

    indices = np.arange(labels.shape[0])
    try:
        train, test = train_test_split(
            indices, test_size=held_out, stratify=labels, random_state=seed
        )
    except ValueError as exc:
        raise InvalidRequest(
            f"held_out {held_out} of {labels.shape[0]} texts cannot keep both classes on both "
            f"sides ({exc}); send more texts",
            param="held_out",
        ) from None
    if len(set(labels[train].tolist())) < 2 or len(set(labels[test].tolist())) < 2:
        raise InvalidRequest(
            f"held_out {held_out} of {labels.shape[0]} texts leaves one class out of a side; send "
            "more texts",
            param="held_out",
        )
    return np.sort(train), np.sort(test)


def positions_read(point: int) -> ResidualRead:
    """A read of every prompt position at `point` whose encode, on the scheduler thread, hands
    back the text's residuals at all but the first position (float32 numpy `[positions, d]`)."""

    def positions(residuals: torch.Tensor) -> np.ndarray:
        return residuals[SKIPPED_POSITIONS:].float().numpy().copy()

    return ResidualRead(point, False, "prompt", TAG, encode=positions)


@dataclass
class TrainingRun:
    """One training job's work: call it with the job's handle."""

    state: ProbeParts
    model: str
    body: ProbeTrainRequest
    layer: int
    hook_point: str
    point: int
    examples: ProbeExamples

    def __call__(self, handle: JobHandle) -> dict:
        residuals: list[np.ndarray] = []
        read = positions_read(self.point)
        texts = [np.asarray(ids) for ids in self.examples.prompts]
        for group in groups(texts, GROUP_TOKENS):
            handle.check()
            began = time.monotonic()
            answered = passes_blocking(
                self.state.switch,
                self.model,
                [self.examples.prompts[i] for i in group],
                (read,),
                cancel=handle.cancel_event,
            )
            if answered is None:
                handle.check()  # cancelled while it ran
                raise JobCancelled()
            residuals += [
                capture.encoded
                for capture in sorted(answered.reads, key=lambda capture: capture.row)
            ]
            handle.advance(len(group))
            handle.pace(time.monotonic() - began)
        handle.check()
        fitted = fit(residuals, self.examples, self.body.threshold)
        handle.check()
        row = self.state.probes.create(self._document(fitted))
        return {"probe": probe_view(row), "metrics": fitted.metrics(self.examples)}

    def _document(self, fitted: Fitted) -> dict:
        examples, body = self.examples, self.body
        negatives = len(examples.prompts) - examples.positives
        training = {
            "model": self.model,
            "positives": examples.positives,
            "negatives": negatives,
            "held_out": int(examples.test.size),
            "accuracy": fitted.accuracy,
            "auc": fitted.auc,
            "position_accuracy": fitted.position_accuracy,
            "position_auc": fitted.position_auc,
            "seed": body.seed,
            "trained_at": time.time(),
        }
        description = (
            body.description
            if body.description is not None
            else (
                f"linear probe trained on {examples.positives} positive and {negatives} negative "
                "texts"
            )
        )
        detector = {
            "type": "linear",
            "layer": self.layer,
            "hook_point": self.hook_point,
            "weights": fitted.weights,
            "bias": fitted.bias,
            "threshold": body.threshold,
            "training": training,
        }
        return {"name": body.name, "description": description, "detector": detector}


@dataclass(frozen=True)
class Fitted:
    """A fitted probe on the raw residual, and how it did on the held-out texts."""

    weights: list[float]
    bias: float
    threshold: float
    accuracy: float  # of the verdict on each held-out text
    auc: float  # of each held-out text's largest probability
    position_accuracy: float  # per held-out position, labelled by its text
    position_auc: float
    train_accuracy: float  # of the verdict on each training text
    positions: int  # training positions

    def metrics(self, examples: ProbeExamples) -> dict:
        """The job result's figures: held-out accuracy and AUC, and which texts were held out."""
        positives = examples.positives
        return {
            "accuracy": self.accuracy,
            "auc": self.auc,
            "position_accuracy": self.position_accuracy,
            "position_auc": self.position_auc,
            "train_accuracy": self.train_accuracy,
            "threshold": self.threshold,
            "train": int(examples.train.size),
            "held_out": int(examples.test.size),
            "train_positions": self.positions,
            "held_out_texts": {
                "positive": [int(i) for i in examples.test if i < positives],
                "negative": [int(i - positives) for i in examples.test if i >= positives],
            },
        }


def probabilities(x: np.ndarray, weights: np.ndarray, bias: float) -> np.ndarray:
    """sigmoid(w·x + b) per position (float64, without overflow)."""
    from scipy.special import expit

    return expit(x.astype(np.float64) @ weights + bias)


def peaks(residuals: list[np.ndarray], weights: np.ndarray, bias: float) -> np.ndarray:
    """Each text's largest probability over its positions: it fires where this reaches the
    threshold."""
    return np.array([probabilities(x, weights, bias).max() for x in residuals])


def fit(residuals: list[np.ndarray], examples: ProbeExamples, threshold: float) -> Fitted:
    """Logistic regression on the standardised residuals of the training texts' positions (each
    labelled by its text, each text weighing one), folded back to raw-residual weights and
    measured on the held-out texts as the probe is used (fired or not at `threshold`)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, roc_auc_score
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    labels = examples.labels
    train = [residuals[i] for i in examples.train]
    x = np.concatenate(train).astype(np.float64)
    y = np.concatenate(
        [np.full(len(r), labels[i]) for i, r in zip(examples.train, train, strict=True)]
    )
    weight = np.concatenate([np.full(len(r), 1.0 / len(r)) for r in train])
    with threadpool_limits(limits=1):
        scaler = StandardScaler().fit(x, sample_weight=weight)
        model = LogisticRegression(max_iter=2000).fit(
            scaler.transform(x), y, sample_weight=weight / weight.mean()
        )
    coef = model.coef_[0] / scaler.scale_
    bias = float(model.intercept_[0] - np.sum(model.coef_[0] * scaler.mean_ / scaler.scale_))

    held = [residuals[i] for i in examples.test]
    held_labels = labels[examples.test]
    texts = peaks(held, coef, bias)
    positions = probabilities(np.concatenate(held), coef, bias)
    position_labels = np.concatenate(
        [np.full(len(r), label) for r, label in zip(held, held_labels, strict=True)]
    )
    return Fitted(
        weights=[float(w) for w in coef],
        bias=bias,
        threshold=threshold,
        accuracy=float(accuracy_score(held_labels, texts >= threshold)),
        auc=float(roc_auc_score(held_labels, texts)),
        position_accuracy=float(accuracy_score(position_labels, positions >= threshold)),
        position_auc=float(roc_auc_score(position_labels, positions)),
        train_accuracy=float(
            accuracy_score(labels[examples.train], peaks(train, coef, bias) >= threshold)
        ),
        positions=int(x.shape[0]),
    )
