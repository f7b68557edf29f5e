"""Calibrations: how each feature of an SAE usually fires on one model, stored per (SAE, model).

A calibration (made by a job, see lab/calibration/job.py, or shipped beside an SAE's files as
`calibration.json`) gives every feature its firing frequency, mean and max activation, its
quantiles and its top activating snippets. The CalibrationBook keeps what per-activation
percentiles need in memory (a quantile grid per feature, loaded at start-up), so a percentile
is a lookup that never touches the store; the figures themselves are read from the store on
demand (management routes, on the worker pool), the last few kept parsed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ValidationError, computed_field

from millm.errors import Conflict
from millm.interp.calibration_stats import PercentileTable, unpack_corpus, unpack_grids
from millm.interp.sae_files import SAEInfo
from millm.store.calibrations import (
    CalibrationRow,
    all_calibrations,
    delete_calibration,
    get_calibration,
    put_calibration,
)
from millm.store.database import Store

log = logging.getLogger(__name__)

SHIPPED_FILE = (
    "calibration.json"  # a calibration shipped in an SAE's folder, imported on registration
)
SHIPPED_KIND = "millm.calibration"
SHIPPED_VERSION = 1
PARSED_KEPT = 4  # calibrations whose figures stay parsed in memory

QUANTILES_NOTE = (
    "mean, p50, p90 and p99 are over the positions where the feature fired (activation > 0): most "
    "positions of a sparse feature are 0, so quantiles over all positions would be 0 as well; "
    "frequency is the fraction of positions read where it fired, max the largest activation."
)
TOP_EXAMPLES_NOTE = (
    "top_examples are the feature's largest activations, largest first (ties: the earlier text and "
    "position), each with 16 tokens before and 4 after; a snippet equal to one already listed is "
    "skipped (repeated prompts would fill the list with copies), choosing among 4 x top_examples "
    "candidates."
)
PERCENTILES_NOTE = (
    "a percentile places a value among the feature's firing activations in this calibration "
    "(0-100), read from its quantiles at every whole percent, linear between them: within about "
    "one percentile point, 100 above the calibration's max; null for a feature that never fired."
)


class TopExample(BaseModel):
    """One of a feature's largest activations: where (text and token position) and the text
    around it."""

    text_index: (
        int  # the text's index in the calibration's corpus (texts first, then conversations)
    )
    position: int  # the token's position in that text
    activation: float
    before: str  # up to 16 tokens before it
    token: str
    after: str  # up to 4 tokens after it

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented spelling for a computed field
    @property
    def display(self) -> str:
        """The snippet with the token marked [[like this]] (as the demo labels' `example`)."""
        return f"{self.before}[[{self.token}]]{self.after}"


class FeatureFigures(BaseModel):
    """One feature over a calibration corpus (see QUANTILES_NOTE for which positions each figure
    is over)."""

    index: int
    count: int  # positions where it fired
    frequency: float  # count / positions read
    mean: float | None  # mean activation where it fired (None: never fired)
    max: float  # largest activation (0: never fired)
    p50: float | None
    p90: float | None
    p99: float | None
    top_examples: list[TopExample]  # largest first, each snippet different (see TOP_EXAMPLES_NOTE)


class CalibrationBudget(BaseModel):
    """The budget a calibration was asked to keep, and what it read of the corpus it was given."""

    max_tokens: int | None = None
    max_seconds: float | None = None
    texts_offered: int  # texts in the corpus given (before the token budget)
    tokens_offered: int
    stopped_by: Literal["max_tokens", "max_seconds"] | None = (
        None  # None: the whole corpus was read
    )


class CalibrationSummary(BaseModel):
    """What a calibration was made of, and how its figures are defined."""

    sae_id: str
    model: str  # the served model name it was read on
    model_fingerprint: str | None = None
    created_at: float
    corpus: (
        str  # "demo" (the corpus shipped with the SAE) or "request" (texts and conversations sent)
    )
    texts: int
    tokens: int  # tokens fed (each text cut to max_tokens_per_text)
    positions: int  # positions read: every token but each text's first
    truncated_texts: int
    max_tokens_per_text: int
    top_examples: int
    d_sae: int
    features_fired: int
    sample_rate: (
        float  # 1.0: every firing value went into the quantiles; less: a uniform sample of them
    )
    duration_s: float
    budget: CalibrationBudget | None = None  # asked with max_tokens or max_seconds
    quantiles: str = QUANTILES_NOTE
    examples: str = TOP_EXAMPLES_NOTE
    percentiles: str = PERCENTILES_NOTE


class CalibrationView(BaseModel):
    """GET /api/saes/{id}/calibration: the summary, and the figures of the features asked for."""

    object: str = "calibration"
    summary: CalibrationSummary
    features: list[FeatureFigures] | None = None


def table_of(figures: dict, created_at: float) -> PercentileTable:
    """The percentile grids of stored figures (`grids`, packed: see
    calibration_stats.pack_grids)."""
    return PercentileTable(unpack_grids(figures["grids"]), created_at)


class CalibrationBook:
    """The stored calibrations: summaries and percentile grids in memory, figures from the store."""

    def __init__(self, store: Store):
        self.store = store
        self._lock = threading.Lock()
        self._summaries: dict[tuple[str, str], CalibrationSummary] = {}
        self._tables: dict[tuple[str, str], PercentileTable] = {}
        self._parsed: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self._running: dict[tuple[str, str], dict] = {}
        self.reload()

    def reload(self) -> None:
        """Read every stored calibration's summary again (at start, and when another replica
        saved or deleted one)."""
        rows = all_calibrations(self.store)
        with self._lock:
            for key in set(self._summaries) - {(row.sae_id, row.model) for row in rows}:
                self._summaries.pop(key, None)
                self._tables.pop(key, None)
                self._parsed.pop(key, None)
        for row in rows:
            known = self.table(row.sae_id, row.model)
            if known is not None and known.created_at == row.created_at:
                continue  # the same calibration: its grids stand
            try:
                self._remember(row)
            except (ValidationError, KeyError, ValueError) as exc:
                log.warning(
                    "stored calibration of %s on %s is unreadable (%s); it is ignored",
                    row.sae_id,
                    row.model,
                    exc,
                )

    def _remember(self, row: CalibrationRow) -> None:
        summary = CalibrationSummary.model_validate(row.summary)
        table = table_of(row.figures, row.created_at)
        key = (row.sae_id, row.model)
        with self._lock:
            self._summaries[key] = summary
            self._tables[key] = table
            self._parsed.pop(key, None)

    # reading ---------------------------------------------------------------------------------
    def summary(self, sae_id: str, model: str) -> CalibrationSummary | None:
        """The calibration's summary, or None when `sae_id` is not calibrated on `model`."""
        with self._lock:
            return self._summaries.get((sae_id, model))

    def table(self, sae_id: str, model: str) -> PercentileTable | None:
        """The calibration's percentile grids (a request keeps this snapshot), or None."""
        with self._lock:
            return self._tables.get((sae_id, model))

    def percentile(self, sae_id: str, model: str, feature: int, value: float) -> float | None:
        """The percentile of `value` among the feature's firing activations in the calibration (see
        PERCENTILES_NOTE); None when not calibrated on this model or the feature never fired."""
        table = self.table(sae_id, model)
        return None if table is None else table.of(feature, value)

    def figures(
        self, sae_id: str, model: str, indices: list[int] | None = None
    ) -> dict[int, FeatureFigures]:
        """Figures of the features asked for (all when None; indices past the width are left out);
        empty when not calibrated. Reads the store: call it from a worker thread."""
        stored = self._stored_features(sae_id, model)
        if stored is None:
            return {}
        wanted = (
            range(len(stored)) if indices is None else [i for i in indices if 0 <= i < len(stored)]
        )
        return {i: FeatureFigures.model_validate(stored[i]) for i in wanted}

    def corpus(self, sae_id: str, model: str) -> list[np.ndarray] | None:
        """The token ids a calibration read from texts sent with its request (kept with it since
        explaining came); None when none are kept. Reads the store: call it from a worker thread."""
        row = get_calibration(self.store, sae_id, model)
        if row is None or "corpus" not in row.figures:
            return None
        return unpack_corpus(row.figures["corpus"])

    def _stored_features(self, sae_id: str, model: str) -> list[dict] | None:
        key = (sae_id, model)
        with self._lock:
            if key in self._parsed:
                self._parsed.move_to_end(key)
                return self._parsed[key]["features"]
            if key not in self._summaries:
                return None
        row = get_calibration(self.store, sae_id, model)
        if row is None:
            return None
        with self._lock:
            current = self._tables.get(key)
            if (
                current is not None and current.created_at == row.created_at
            ):  # not one replaced meanwhile
                self._parsed[key] = row.figures
                while len(self._parsed) > PARSED_KEPT:
                    self._parsed.popitem(last=False)
        return row.figures["features"]

    # changing --------------------------------------------------------------------------------
    def save(self, row: CalibrationRow) -> None:
        """Store a calibration (replacing the one of the same SAE and model) and use it from now
        on."""
        put_calibration(self.store, row)
        self._remember(row)

    def delete(self, sae_id: str, model: str) -> bool:
        """Forget the calibration of `sae_id` on `model`; returns whether there was one."""
        deleted = delete_calibration(self.store, sae_id, model)
        with self._lock:
            self._summaries.pop((sae_id, model), None)
            self._tables.pop((sae_id, model), None)
            self._parsed.pop((sae_id, model), None)
        return deleted

    def claim(self, sae_id: str, model: str) -> dict:
        """Mark a calibration of `sae_id` on `model` as running (409 calibration_running if one is);
        returns the claim, whose "job" the caller fills in and gives back to `release`."""
        key = (sae_id, model)
        with self._lock:
            running = self._running.get(key)
            if running is not None:
                raise Conflict(
                    f"a calibration of {sae_id} on {model!r} is already running "
                    f"({running.get('job') or 'starting'}); wait for it or cancel it (DELETE "
                    f"/api/jobs/{{id}})",
                    param="sae_id",
                    code="calibration_running",
                )
            claim: dict = {"job": None}
            self._running[key] = claim
            return claim

    def release(self, sae_id: str, model: str, claim: dict) -> None:
        """The calibration of this claim ended (or never started)."""
        with self._lock:
            if self._running.get((sae_id, model)) is claim:
                del self._running[(sae_id, model)]

    def import_shipped(self, info: SAEInfo, model: str | None = None) -> bool:
        """Store the calibration shipped in an SAE's folder (`calibration.json`) for the model it
        names (only if that is `model`, when given) unless one is stored already; returns whether
        it was."""
        row = self.shipped(info)
        if (
            row is None
            or (model is not None and row.model != model)
            or self.summary(row.sae_id, row.model) is not None
        ):
            return False
        self.save(row)
        log.info("imported the calibration of %s on %s shipped with the SAE", row.sae_id, row.model)
        return True

    @staticmethod
    def shipped(info: SAEInfo) -> CalibrationRow | None:
        """The calibration shipped in the SAE's folder, if it has a readable one of these
        weights."""
        folder = Path(info.path)
        path = (folder if folder.is_dir() else folder.parent) / SHIPPED_FILE
        if not path.is_file():
            return None
        try:
            return shipped_row(json.loads(path.read_text()), info)
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            log.warning(
                "%s is not a calibration of %s millm can read (%s); it is not imported",
                path,
                info.id,
                exc,
            )
            return None


def shipped_document(row: CalibrationRow) -> dict:
    """A stored calibration as the file shipped beside an SAE."""
    return {
        "kind": SHIPPED_KIND,
        "version": SHIPPED_VERSION,
        "sae_id": row.sae_id,
        "model": row.model,
        "created_at": row.created_at,
        "summary": row.summary,
        "figures": row.figures,
    }


def shipped_row(document: dict, info: SAEInfo) -> CalibrationRow:
    """A shipped calibration file as a row to store; ValueError when it is not one of this SAE."""
    if document.get("kind") != SHIPPED_KIND or document.get("version") != SHIPPED_VERSION:
        raise ValueError(f"kind/version is not {SHIPPED_KIND} v{SHIPPED_VERSION}")
    if document["sae_id"] != info.id:
        raise ValueError(f"it was made for {document['sae_id']}, not these weights ({info.id})")
    figures = document["figures"]
    if (
        len(figures["features"]) != info.d_sae
        or unpack_grids(figures["grids"]).shape[0] != info.d_sae
    ):
        raise ValueError(
            f"it has figures for {len(figures['features'])} features, the SAE has {info.d_sae}"
        )
    CalibrationSummary.model_validate(document["summary"])
    return CalibrationRow(
        info.id, str(document["model"]), document["summary"], figures, float(document["created_at"])
    )


def add_percentiles(rows: list[list[dict]], table: PercentileTable | None) -> list[list[dict]]:
    """Each entry's `percentile` (None throughout when the SAE is not calibrated on this model);
    plain numpy lookups."""
    for entries in rows:
        for entry in entries:
            entry["percentile"] = (
                table.of(entry["index"], entry["value"]) if table is not None else None
            )
    return rows


def percentiles_block(sae_id: str, table: PercentileTable | None) -> dict:
    """What a block with percentiles says about them: calibrated or not, and what they mean."""
    if table is None:
        return {
            "calibrated": False,
            "note": f"SAE {sae_id} is not calibrated on this model, so every percentile is null; "
            f"POST /api/saes/{sae_id}/calibrate makes a calibration.",
        }
    return {"calibrated": True, "calibrated_at": table.created_at, "note": PERCENTILES_NOTE}
