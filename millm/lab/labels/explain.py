"""The explaining job: a calibrated SAE's features explained by a model and scored by detection.

The job reads the calibration's corpus again through the attached SAE, once for all its features
(the same reads, so a feature's top window holds exactly the calibration's largest activation; each
pass stops at the SAE's layer, since nothing after it is used), keeping the chosen features'
activation at every token; its result counts the texts read (`texts_read` of `texts`), and a
feature's windows are the same whichever other features share the job. Then, feature by feature:
delphi's windows and samples (lab/labels/explain_examples.py), the explainer's chat
(lab/labels/explain_prompts.py), the explanation, the scorer's answer for every held-out text, the
detection score, and one store write. Every explanation is stored as soon as it is scored, beside
the labels (never over one), so a job that fails or is cancelled later keeps what it wrote. Engine
work goes through the scheduler (kernel/runtime/blocking.py); the job's own thread does numpy and
the tokenizer only.

Over 400 lines because it is one job's steps in the order they run (read, window, explain,
score, store, each a function); the windows, prompts and scoring it calls live in their own
modules.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from millm.errors import InvalidRequest
from millm.interp.steering import Attached, check_feature
from millm.kernel.runtime.blocking import passes_blocking
from millm.kernel.runtime.jobs import JobHandle, JobWorkFailed
from millm.lab.calibration.job import groups
from millm.lab.calibration.protocol import CalibrateRequest, Corpus, check_source, corpus_ids
from millm.lab.discovery.reads import discovery_read
from millm.lab.labels.explain_examples import (
    Examples,
    Window,
    choose,
    fuzzed_marks,
    marks_per_window,
    windows,
)
from millm.lab.labels.explain_prompts import (
    Messages,
    detection_messages,
    explainer_messages,
    fuzz_marks,
    fuzzing_messages,
    marked,
    parsed_explanation,
)
from millm.lab.labels.explain_scoring import BalancedScore, ScoredText, balanced_score
from millm.lab.labels.protocol import ExplainRequest
from millm.lab.labels.writers import (
    BesideWriter,
    ServedWriter,
    Writer,
    digit_ids,
)

if TYPE_CHECKING:
    from millm.lab.labels.parts import LabelParts

ANSWER_START = "[EXPLANATION]:"  # what a served explainer's answer is begun with


def beside_writer(state: LabelParts, request: ExplainRequest, served: str) -> BesideWriter | None:
    """The registered model the job loads beside the served one, when the explainer or the scorer
    names one that is not the served model (its load planned now: a 400 naming the field for a
    model not registered, the load's refusals for one that does not fit); one model at a time."""
    named = {}
    if request.explainer == "model" and request.explainer_model != served:
        named["explainer_model"] = request.explainer_model
    kind, model = request.scorer_kind
    if kind == "model" and model != served:
        named["scorer_model" if request.scorer else "explainer_model"] = model
    if not named:
        return None
    if len(set(named.values())) > 1:
        raise InvalidRequest(
            "scorer_model: one model at a time is loaded beside the served one; name the "
            "explainer's model, the served model or the endpoint to score",
            param="scorer_model",
        )
    param, name = next(iter(named.items()))
    return BesideWriter(state.switch.beside.plan(str(name), param))


def selected(
    state: LabelParts, sae_id: str, model: str, request: ExplainRequest, info
) -> list[int]:
    """The features the request names, checked against the SAE's width and the server's cap."""
    param = request.selection
    if request.features is not None:
        features = list(dict.fromkeys(request.features))
    elif request.range is not None:
        features = list(range(request.range.start, min(request.range.end, info.d_sae)))
    else:
        figures = state.calibrations.figures(sae_id, model)
        fired = [f for f in figures.values() if f.count > 0]
        if request.densest is not None:
            fired.sort(key=lambda f: (-f.count, f.index))
            features = [f.index for f in fired[: request.densest]]
        else:
            named = set(state.labels.entries(sae_id)) | {
                row.feature for row in state.labels.explanations(sae_id)
            }
            features = [f.index for f in fired if f.index not in named][: request.unlabelled]
    cap = state.settings.explain_max_features
    if len(features) > cap:
        raise InvalidRequest(
            f"{param}: {len(features)} features are over MILLM_EXPLAIN_MAX_FEATURES ({cap}); "
            "explain fewer at a time",
            param=param,
        )
    if not features:
        raise InvalidRequest(f"{param}: no feature to explain", param=param)
    for index in features:
        check_feature(info, index, param=param)
    return features


def read_corpus(state: LabelParts, request: ExplainRequest, summary, info, lm) -> Corpus:
    """The token ids to read: the request's corpus, else the calibration's (the shipped one, or
    the texts its request sent, which the calibration keeps)."""
    max_tokens = summary.max_tokens_per_text
    if request.corpus is None and request.texts is None and request.conversations is None:
        if summary.corpus == "demo":
            asked = CalibrateRequest(corpus="demo", max_tokens_per_text=max_tokens)
            return corpus_ids(lm.tokenizer, asked, info, lm.context_length)
        kept = state.calibrations.corpus(info.id, lm.name)
        if kept is None:
            raise InvalidRequest(
                "this calibration was made before millm kept a calibration's texts: send the same "
                "texts (or conversations) to explain from, or calibrate again",
                param="texts",
            )
        return Corpus("calibration", kept, 0)
    asked = CalibrateRequest(
        corpus=request.corpus,
        texts=request.texts,
        conversations=request.conversations,
        max_tokens_per_text=max_tokens,
    )
    check_source(asked)
    return corpus_ids(lm.tokenizer, asked, info, lm.context_length)


@dataclass
class ExplainRun:
    """One explaining job's work: call it with the job's handle."""

    state: LabelParts
    attached: Attached
    model: str
    tokenizer: Any
    corpus: Corpus
    features: list[int]
    request: ExplainRequest
    explainer: Writer
    scorer: Writer
    version: str
    texts_read: int = 0  # corpus texts read through the SAE so far: each once per job

    def __call__(self, handle: JobHandle) -> dict:
        started = time.monotonic()
        columns = self._read(handle)
        done: list[dict] = []
        skipped: list[dict] = []
        with self._beside():
            for position, feature in enumerate(self.features):
                handle.check()
                examples = self.examples(columns, position)
                if not examples.top:
                    skipped.append({"feature": feature, "reason": "it never fired on the corpus"})
                else:
                    outcome = self._explain(feature, examples, handle)
                    (done if "explanation" in outcome else skipped).append(outcome)
                handle.report(self.outcome(done, skipped))
                handle.advance(1)
        result = {**self.outcome(done, skipped), "duration_s": round(time.monotonic() - started, 1)}
        if not done:
            # Nothing stored is not success: the job list shows it failed, the result says why.
            raise JobWorkFailed(nothing_written(skipped), code="nothing_explained", result=result)
        return result

    def outcome(self, done: list[dict], skipped: list[dict]) -> dict:
        """The result so far: the SAE and features the job covers, what it wrote and skipped
        (copies: the job goes on appending while a reader serialises them)."""
        return {
            "sae_id": self.attached.info.id,
            "features": list(self.features),
            "explained": len(done),
            "flagged": sum(1 for d in done if d["flagged"]),
            "explanations": list(done),
            "skipped": list(skipped),
            "prompt_version": self.version,
            "texts": len(self.corpus.texts),
            "texts_read": self.texts_read,
        }

    @contextmanager
    def _beside(self) -> Iterator[None]:
        """The registered model the explainer or scorer names, loaded beside the served one while
        the features are explained (once the activations are read), then freed."""
        beside = next(
            (w for w in (self.explainer, self.scorer) if isinstance(w, BesideWriter)), None
        )
        if beside is None:
            yield
            return
        with self.state.switch.beside.loaded(beside.planned) as engine:
            if self.scorer is beside:
                digit_ids(engine.lm.tokenizer)
            beside.bound = ServedWriter(self.state, engine, engine.lm.tokenizer)
            try:
                yield
            finally:
                beside.bound = None

    def _read(self, handle: JobHandle) -> list[np.ndarray]:
        """Per text, the chosen features' activation at every token `[T, k]` (0 at position 0, never
        read): every text read once, for all the job's features together."""
        columns: list[np.ndarray] = [
            np.zeros((len(ids), len(self.features)), np.float32) for ids in self.corpus.texts
        ]
        chosen = torch.tensor(self.features)
        for group in groups(self.corpus.texts):
            handle.check()
            read = discovery_read(self.attached, keeper(columns, group, chosen))
            prompts = [self.corpus.texts[i].tolist() for i in group]
            if (
                passes_blocking(
                    self.state.switch,
                    self.model,
                    prompts,
                    (read,),
                    cancel=handle.cancel_event,
                    reads_only=True,
                )
                is None
            ):
                handle.check()
            self.texts_read += len(group)
            handle.report(self.outcome([], []))  # the read is the job's first phase: texts_read
        return columns

    def examples(self, columns: list[np.ndarray], position: int) -> Examples:
        """The feature's windows, chosen as delphi chooses them."""
        every: list[Window] = []
        for text, ids in enumerate(self.corpus.texts):
            every += windows(text, ids, columns[text][:, position], self.request.width)
        per_quantile = max(1, self.request.held_out // self.request.quantiles)
        return choose(
            every,
            top=self.request.top_examples,
            quantiles=self.request.quantiles,
            per_quantile=per_quantile,
            seed=self.request.seed,
        )

    def _strings(self, window: Window) -> list[str]:
        return [self.tokenizer.decode([token]) for token in window.tokens]

    def _written(
        self, feature: int, examples: Examples, handle: JobHandle
    ) -> tuple[str, str] | dict:
        """(explanation, who wrote it): the explainer's, or with `score_labels` the feature's own
        label; else why there is none (a skipped entry)."""
        if self.request.score_labels:
            entry = self.state.labels.entries(self.attached.info.id).get(feature)
            if entry is None:
                return {"feature": feature, "reason": "it has no label to score"}
            return str(entry["label"]), f"label:{entry['source']}"
        peak = examples.top[0].peak
        shown = [(self._strings(w), list(w.activations)) for w in examples.top]
        answer = self.explainer.write(
            explainer_messages(shown, peak),
            self.request.max_tokens,
            handle.cancel_event,
            ANSWER_START if self.request.answer_start else "",
        )
        handle.check()
        explanation = parsed_explanation(answer)
        if explanation is None:
            reason = (
                "the explainer wrote nothing after [EXPLANATION]:"
                if ANSWER_START in answer
                else "the explainer's answer has no [EXPLANATION]: line"
            )
            return {"feature": feature, "reason": reason, "answer": answer[:500]}
        return explanation, self.explainer.name

    def _explain(self, feature: int, examples: Examples, handle: JobHandle) -> dict:
        written = self._written(feature, examples, handle)
        if isinstance(written, dict):
            return written
        explanation, author = written
        activating = [self._strings(w) for w in examples.activating]
        quiet = [self._strings(w) for w in examples.quiet]
        scores: dict[str, BalancedScore | None] = {}
        if "detection" in self.request.scoring:
            texts = ["".join(t) for t in activating + quiet]
            chats = [detection_messages(explanation, text) for text in texts]
            scores["detection"] = self._score(chats, len(activating), handle)
        if "fuzzing" in self.request.scoring:
            rng = np.random.default_rng([self.request.seed, feature])
            count = marks_per_window(examples.activating)
            texts = [
                marked(t, fuzz_marks(list(w.activations)))
                for t, w in zip(activating, examples.activating, strict=True)
            ] + [
                marked(t, fuzzed_marks(w, count, rng))
                for t, w in zip(quiet, examples.quiet, strict=True)
            ]
            chats = [fuzzing_messages(explanation, text) for text in texts]
            scores["fuzzing"] = self._score(chats, len(activating), handle)
        # Flagged by the first score asked for (detection, unless only fuzzing was).
        first = scores[self.request.scoring[0]]
        floor = self.state.settings.explain_flag_below
        detail = {
            "scorer": self.scorer.name,
            "prompt_version": self.version,
            **{name: s.model_dump() if s is not None else None for name, s in scores.items()},
            "flagged": first is None or first.balanced_accuracy < floor,
            "examples": len(examples.top),
            "model": self.model,
        }
        self.state.labels.explain(self.attached.info.id, feature, author, explanation, detail)
        return {"feature": feature, "explanation": explanation, "explainer": author, **detail}

    def _score(
        self, chats: list[Messages], activating: int, handle: JobHandle
    ) -> BalancedScore | None:
        """Balanced accuracy of the scorer's answers: the first `activating` chats hold texts the
        feature fired in (or marked where it fired), the rest do not; None without any chat."""
        if not chats:
            return None
        probabilities = self.scorer.yes(chats, handle.cancel_event)
        handle.check()
        return balanced_score([ScoredText(i < activating, p) for i, p in enumerate(probabilities)])


def nothing_written(skipped: list[dict]) -> str:
    """Why a job stored no explanation: each skip reason with how many features it held back."""
    if len(skipped) == 1:
        only = skipped[0]
        return f"no explanation was written for feature {only['feature']}: {only['reason']}"
    reasons: dict[str, int] = {}
    for entry in skipped:
        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + 1
    why = "; ".join(f"{n} of them: {reason}" for reason, n in reasons.items())
    return f"no explanation was written for any of the {len(skipped)} features ({why})"


def keeper(columns: list[np.ndarray], group: list[int], chosen: torch.Tensor):
    """The discovery read's summary for one engine call (on the scheduler thread): each text's
    activations of the chosen features, written into its array; nothing is returned."""
    texts = iter(group)  # the scoring job reads its prompts in order, one summary each

    def keep(acts: torch.Tensor, positions: tuple[int, ...]) -> None:
        columns[next(texts)][list(positions)] = acts[:, chosen].float().numpy()

    return keep
