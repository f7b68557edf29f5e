"""The calibration job: every text read once through the attached SAE, folded into per-feature
figures.

The job's thread never touches torch. Each engine call (one text, or a few very short ones,
one forward pass each) goes to the scheduler thread through passes_blocking with a discovery
read whose `summarise` runs there: it takes the positions where features fired out
of the dense activations and folds them into the job's Accumulator (numpy). Between calls the
job reports progress (unit: texts), yields to serving (JobHandle.pace) and looks for a cancel.
At the end, on the job's thread: the quantiles (numpy), the snippets (the tokenizer's decode,
which is not torch), and one store write that replaces the SAE's calibration on this model;
a cancelled or failed job writes nothing, so the earlier calibration stays.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from millm.errors import InvalidRequest
from millm.interp.calibration_stats import Accumulator, pack_corpus, pack_grids
from millm.interp.steering import Attached
from millm.kernel.books.calibrations import CalibrationBudget, CalibrationSummary
from millm.kernel.runtime.blocking import passes_blocking
from millm.kernel.runtime.jobs import JobHandle
from millm.lab.calibration.protocol import (
    CalibrateRequest,
    Corpus,
)
from millm.lab.discovery.reads import discovery_read
from millm.store.calibrations import CalibrationRow

if TYPE_CHECKING:
    from millm.lab.calibration.parts import CalibrationParts

# Texts per engine call: up to this many tokens (one text at least). A request arriving meanwhile
# waits for the whole call, so calls stay short; only very short texts share one.
GROUP_TOKENS = 64
BEFORE, AFTER = 16, 4  # tokens of context around a top example's token
# Candidates kept per top example asked for: a snippet equal to one already chosen is skipped
# (a repeated prompt, like a persona system prompt, would otherwise fill the list with copies).
CANDIDATES = 4
FIGURE_DIGITS = (
    6  # significant digits kept of each figure (the percentile grid is kept exact: float32)
)


def groups(texts: Sequence[Sized], budget: int = GROUP_TOKENS) -> list[list[int]]:
    """Consecutive text indices in runs of at most `budget` tokens (a longer text alone)."""
    out: list[list[int]] = []
    tokens = budget
    for i, ids in enumerate(texts):
        if tokens + len(ids) > budget:
            out.append([])
            tokens = 0
        out[-1].append(i)
        tokens += len(ids)
    return out


def significant(value: float, digits: int) -> float:
    """`value` rounded to `digits` significant digits (figures are stored as JSON numbers)."""
    return float(f"{value:.{digits}g}")


def quantile(grid: np.ndarray, percent: int) -> float | None:
    """A feature's quantile at a whole percent from its grid (None: it never fired)."""
    value = float(grid[percent])
    return None if math.isnan(value) else significant(value, FIGURE_DIGITS)


@dataclass
class CalibrationRun:
    """One calibration job's work: call it with the job's handle."""

    state: CalibrationParts
    attached: Attached
    model: str
    fingerprint: str
    tokenizer: Any  # a transformers tokenizer
    corpus: Corpus
    request: CalibrateRequest
    claim: dict
    offered: Corpus  # the corpus given, before the token budget

    def __call__(self, handle: JobHandle) -> dict:
        try:
            return self._run(handle)
        finally:
            self.state.calibrations.release(self.attached.info.id, self.model, self.claim)

    def _run(self, handle: JobHandle) -> dict:
        started = time.monotonic()
        accumulator = Accumulator(self.attached.sae.d_sae, self.request.top_examples * CANDIDATES)
        texts_read, out_of_time = 0, False
        for group in groups(self.corpus.texts):
            if self._out_of_time(started) and texts_read:
                out_of_time = True
                break
            handle.check()
            self._check_attached()
            began = time.monotonic()
            read = discovery_read(self.attached, summariser(accumulator, group))
            prompts = [self.corpus.texts[i].tolist() for i in group]
            if (
                passes_blocking(
                    self.state.switch, self.model, prompts, (read,), cancel=handle.cancel_event
                )
                is None
            ):
                handle.check()  # cancelled while it ran
            texts_read += len(group)
            handle.advance(len(group))
            handle.pace(time.monotonic() - began)
        handle.check()
        self.corpus = self.corpus.first_texts(texts_read)
        row = self._row(accumulator, time.monotonic() - started, out_of_time)
        handle.check()
        self.state.calibrations.save(row)
        return row.summary

    def _out_of_time(self, started: float) -> bool:
        """Whether the time budget is spent (checked between engine calls: one call may pass it)."""
        budget = self.request.max_seconds
        return budget is not None and time.monotonic() - started >= budget

    def _budget(self, out_of_time: bool) -> CalibrationBudget | None:
        """What the budget asked and what it cut, for the summary (None without a budget)."""
        request = self.request
        if request.max_tokens is None and request.max_seconds is None:
            return None
        stopped_by = (
            "max_seconds"
            if out_of_time
            else "max_tokens"
            if self.offered.tokens > self.corpus.tokens
            else None
        )
        return CalibrationBudget(
            max_tokens=request.max_tokens,
            max_seconds=request.max_seconds,
            texts_offered=len(self.offered.texts),
            tokens_offered=self.offered.tokens,
            stopped_by=stopped_by,
        )

    def _check_attached(self) -> None:
        state = self.state
        with state.steering.lock:
            now = state.steering.attached.get(self.attached.info.id)
        if now is not self.attached:
            raise InvalidRequest(
                f"SAE {self.attached.info.id} was detached (or attached anew) while it was being "
                "calibrated; the calibration stopped",
                param="sae_id",
                code="sae_not_attached",
            )

    def _row(self, accumulator: Accumulator, duration: float, out_of_time: bool) -> CalibrationRow:
        """The figures of every feature and the summary, ready to store (numpy and the tokenizer
        only)."""
        arrays = accumulator.figures()
        features = []
        for j in range(accumulator.d_sae):
            count = int(arrays["count"][j])
            grid = arrays["grid"][j]
            features.append(
                {
                    "index": j,
                    "count": count,
                    "frequency": significant(arrays["frequency"][j], FIGURE_DIGITS),
                    "mean": None if count == 0 else significant(arrays["mean"][j], FIGURE_DIGITS),
                    "max": significant(arrays["max"][j], FIGURE_DIGITS),
                    "p50": quantile(grid, 50),
                    "p90": quantile(grid, 90),
                    "p99": quantile(grid, 99),
                    "top_examples": self._examples(accumulator.top.of(j)),
                }
            )
        created = time.time()
        totals = accumulator.totals
        summary = CalibrationSummary(
            sae_id=self.attached.info.id,
            model=self.model,
            model_fingerprint=self.fingerprint,
            created_at=created,
            corpus=self.corpus.name,
            texts=len(self.corpus.texts),
            tokens=self.corpus.tokens,
            positions=totals.positions,
            truncated_texts=self.corpus.truncated,
            max_tokens_per_text=self.request.max_tokens_per_text,
            top_examples=self.request.top_examples,
            d_sae=accumulator.d_sae,
            features_fired=int((totals.counts > 0).sum()),
            sample_rate=accumulator.firing.sample_rate,
            duration_s=round(duration, 1),
            budget=self._budget(out_of_time),
        )
        figures = {"features": features, "grids": pack_grids(arrays["grid"])}
        if self.corpus.name == "request":  # texts sent with the request: kept to explain from
            figures["corpus"] = pack_corpus(self.corpus.texts)
        return CalibrationRow(
            self.attached.info.id, self.model, summary.model_dump(), figures, created
        )

    def _examples(self, candidates: list[tuple[int, int, float]]) -> list[dict]:
        """The first `top_examples` candidates (largest first) whose snippets differ."""
        chosen: list[dict] = []
        seen: set[tuple[str, str, str]] = set()
        for text, position, value in candidates:
            example = self._example(text, position, value)
            snippet = (example["before"], example["token"], example["after"])
            if snippet not in seen:
                seen.add(snippet)
                chosen.append(example)
                if len(chosen) == self.request.top_examples:
                    break
        return chosen

    def _example(self, text: int, position: int, value: float) -> dict:
        ids = self.corpus.texts[text]
        decode = self.tokenizer.decode
        return {
            "text_index": text,
            "position": position,
            "activation": significant(value, FIGURE_DIGITS),
            "before": decode(ids[max(0, position - BEFORE) : position].tolist()),
            "token": decode(ids[position : position + 1].tolist()),
            "after": decode(ids[position + 1 : position + 1 + AFTER].tolist()),
        }


def summariser(accumulator: Accumulator, group: list[int]):
    """The discovery read's summary for one engine call (on the scheduler thread): each text's
    firing positions, features and values, folded into the accumulator; nothing is returned."""
    texts = iter(group)  # the scoring job reads its prompts in order, one summary each

    def summarise(acts: torch.Tensor, positions: tuple[int, ...]) -> None:
        text = next(texts)
        rows, features = (acts > 0).nonzero(as_tuple=True)
        values = acts[rows, features].numpy()
        where = np.asarray(positions, dtype=np.int32)[rows.numpy()]
        accumulator.add(text, len(positions), where, features.numpy().astype(np.int32), values)

    return summarise
