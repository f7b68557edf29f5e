"""The LabelBook: every SAE's feature labels, stored per SAE, cached, and searched by rank.

Labels live in the store (store/labels.py) and survive restarts. An SAE's own labels (the
feature_labels.json its file ships) are offered to the store once, when it is first registered (or
first seen by this version), with source `sae_file`; after that the store's set is the SAE's set:
what a user imports replaces or merges into it, and what a user clears stays cleared.

Reads come from memory: the labels of the last LABEL_SETS_KEPT SAEs used, each with its search
index (label_search.py) built on the first search. A write drops that SAE's cached set, so the next
read or search sees the change; a set read while a write was landing is not kept (`_generation`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from millm.errors import MillmError, SAEFormatError
from millm.formats.labels import Label, LabelDocument
from millm.interp.formats import read_labels
from millm.interp.sae_files import LABELS_FILE, SAEInfo
from millm.kernel.books.label_search import FeatureMatch, LabelIndex, fts_query, search_texts
from millm.store.database import Store
from millm.store.explanations import ExplanationRow, explanation_rows, put_explanation
from millm.store.labels import (
    LabelRow,
    clear_labels,
    fill_labels,
    label_rows,
    labels_seeded,
    merge_labels,
    replace_labels,
    seed_labels,
)

log = logging.getLogger(__name__)

LABEL_SETS_KEPT = (
    8  # SAEs whose labels (and search index) stay in memory; the least recently used goes first
)
SAE_FILE = "sae_file"
EXPLAINED = "explained"  # the source a search gives a feature known by a model's explanation only


@dataclass
class _LabelSet:
    """One SAE's labels and explanations as read from the store, and its search index once a
    search needed it."""

    rows: list[LabelRow]
    explanations: list[ExplanationRow] = field(default_factory=list)
    index: LabelIndex | None = None
    entries: dict[int, dict] = field(default_factory=dict)

    def __post_init__(self):
        self.entries = {
            row.feature: {"label": row.label, **row.detail, "source": row.source}
            for row in self.rows
        }

    def best_explanations(self) -> dict[int, ExplanationRow]:
        """Per feature, its explanation with the highest detection balanced accuracy."""
        best: dict[int, ExplanationRow] = {}
        for row in self.explanations:
            held = best.get(row.feature)
            if held is None or accuracy(row) > accuracy(held):
                best[row.feature] = row
        return best

    def searched(self) -> tuple[list[tuple[int, str, str, tuple[str, str]]], dict[int, float]]:
        """The search index's rows: each label, with its feature's explanations searched beside it;
        a feature with explanations only is found by its best one (source `explained`), weighted
        by that explanation's balanced accuracy."""
        told: dict[int, list[str]] = {}
        for row in self.explanations:
            told.setdefault(row.feature, []).append(row.explanation)
        rows = []
        for r in self.rows:
            also, context = search_texts(r.detail)
            rows.append(
                (
                    r.feature,
                    r.label,
                    r.source,
                    ("\n".join([also, *told.get(r.feature, [])]), context),
                )
            )
        accuracies = {}
        for feature, best in sorted(self.best_explanations().items()):
            if feature not in self.entries:
                rows.append((feature, best.explanation, EXPLAINED, ("\n".join(told[feature]), "")))
                accuracies[feature] = accuracy(best)
        return rows, accuracies


def accuracy(row: ExplanationRow) -> float:
    """An explanation's detection balanced accuracy (0 when it could not be scored)."""
    detection = row.detail.get("detection") or {}
    return float(detection.get("balanced_accuracy", 0.0))


@dataclass(frozen=True)
class ImportCounts:
    """What an import did: labels it brought, stored labels it replaced, entries without a label,
    the total now."""

    imported: int
    replaced: int
    skipped: int
    total: int


def _rows(document: LabelDocument) -> list[tuple[int, str, str, dict]]:
    return [(label.index, label.label, document.source, label.detail) for label in document.labels]


def file_rows(entries: dict[int, dict]) -> list[tuple[int, str, str, dict]]:
    """An SAE file's labels (read_labels) as store rows; entries with an empty label are left
    out."""
    rows = []
    for index, entry in sorted(entries.items()):
        label = str(entry.get("label") or "").strip()
        if label:
            rows.append((index, label, SAE_FILE, {k: v for k, v in entry.items() if k != "label"}))
    return rows


class LabelBook:
    """Feature labels of every SAE: import (replace or merge), export, clear, read and ranked
    search."""

    def __init__(self, store: Store, kept: int = LABEL_SETS_KEPT):
        self.store = store
        self.kept = kept
        self._lock = threading.Lock()
        self._sets: OrderedDict[str, _LabelSet] = OrderedDict()
        self._generation: dict[str, int] = {}

    def reload(self) -> None:
        """Forget every label set read so far: another replica changed labels (each is read again
        when asked for)."""
        with self._lock:
            for sae_id in self._sets:
                self._generation[sae_id] = self._generation.get(sae_id, 0) + 1
            self._sets.clear()

    # reads ----------------------------------------------------------------------------------------
    def _set(self, sae_id: str) -> _LabelSet:
        with self._lock:
            cached = self._sets.get(sae_id)
            if cached is not None:
                self._sets.move_to_end(sae_id)
                return cached
            generation = self._generation.get(sae_id, 0)
        fresh = _LabelSet(label_rows(self.store, sae_id), explanation_rows(self.store, sae_id))
        with self._lock:
            if self._generation.get(sae_id, 0) != generation:
                return fresh  # a write landed meanwhile: use what was read, keep nothing
            self._sets[sae_id] = fresh
            self._sets.move_to_end(sae_id)
            while len(self._sets) > self.kept:
                # Not closed here: a search on another thread may still hold its index; the last
                # reference to go closes the in-memory database.
                self._sets.popitem(last=False)
        return fresh

    def entries(self, sae_id: str) -> dict[int, dict]:
        """index -> {"label", <detail>, "source"} of every labelled feature (possibly none)."""
        return self._set(sae_id).entries

    def labels(self, sae_id: str) -> list[Label]:
        """The stored labels, by index, as documents are written from them."""
        return [Label(row.feature, row.label, row.detail) for row in self._set(sae_id).rows]

    def listed(self, sae_id: str) -> list[FeatureMatch]:
        """Every labelled or explained feature once, by index, score null: its label, or its best
        explanation (source `explained`) when it has no label."""
        labels = self._set(sae_id)
        listed = [
            FeatureMatch(index=r.feature, label=r.label, score=None, source=r.source)
            for r in labels.rows
        ]
        listed += [
            FeatureMatch(
                index=feature,
                label=best.explanation,
                score=None,
                source=EXPLAINED,
                balanced_accuracy=accuracy(best),
            )
            for feature, best in labels.best_explanations().items()
            if feature not in labels.entries
        ]
        return sorted(listed, key=lambda m: m.index)

    def version(self, sae_id: str) -> int:
        """A number that changes whenever the SAE's labels or explanations change (for caches of
        them)."""
        with self._lock:
            return self._generation.get(sae_id, 0)

    def explanations(self, sae_id: str) -> list[ExplanationRow]:
        """Every explanation a model wrote for the SAE's features, by feature then explainer."""
        return self._set(sae_id).explanations

    def count(self, sae_id: str) -> int:
        """How many features have a label."""
        return len(self._set(sae_id).rows)

    def search(self, sae_id: str, query: str, limit: int) -> list[FeatureMatch]:
        """Labelled features ranked by relevance to `query` (BM25 over labels, top tokens and
        examples; score larger is better); an empty query (no words) lists them all by index,
        score null. Safe to call from any thread (a job's included); does no torch work."""
        labels = self._set(sae_id)
        if fts_query(query) is None:
            return self.listed(sae_id)[:limit]
        with self._lock:
            if labels.index is None:
                labels.index = LabelIndex(*labels.searched())
            index = labels.index
        return index.search(query, limit)

    # writes ---------------------------------------------------------------------------------------
    def _changed(self, sae_id: str) -> None:
        with self._lock:
            self._generation[sae_id] = self._generation.get(sae_id, 0) + 1
            self._sets.pop(sae_id, None)  # its index closes with its last reference (see _set)

    def replace(self, sae_id: str, document: LabelDocument) -> ImportCounts:
        """The document's labels become the SAE's whole set (one transaction)."""
        try:
            before, total = replace_labels(self.store, sae_id, _rows(document))
        finally:
            self._changed(sae_id)
        return ImportCounts(len(document.labels), before, document.skipped, total)

    def merge(self, sae_id: str, document: LabelDocument) -> ImportCounts:
        """The document's labels replace those of the same features; the others stay (one
        transaction)."""
        try:
            overwritten, total = merge_labels(self.store, sae_id, _rows(document))
        finally:
            self._changed(sae_id)
        return ImportCounts(len(document.labels), overwritten, document.skipped, total)

    def fill(self, sae_id: str, document: LabelDocument) -> ImportCounts:
        """The document's labels for the features that have none; the others keep theirs (one
        transaction). `skipped` adds the document's labels that were kept out."""
        try:
            added, total = fill_labels(self.store, sae_id, _rows(document))
        finally:
            self._changed(sae_id)
        kept_out = len(document.labels) - added
        return ImportCounts(added, 0, document.skipped + kept_out, total)

    def explain(
        self, sae_id: str, feature: int, explainer: str, explanation: str, detail: dict
    ) -> None:
        """Store a model's explanation of a feature beside its labels (never over one)."""
        try:
            put_explanation(self.store, sae_id, feature, explainer, explanation, detail)
        finally:
            self._changed(sae_id)

    def clear(self, sae_id: str) -> int:
        """Remove every label of the SAE; how many there were."""
        try:
            return clear_labels(self.store, sae_id)
        finally:
            self._changed(sae_id)

    def seed(self, info: SAEInfo) -> None:
        """Offer the SAE's own labels to the store (once per SAE; kept only while it has none).
        Raises SAEFormatError when the file's labels are unreadable; call before registering."""
        if not info.has_labels or labels_seeded(self.store, info.id):
            return
        rows = file_rows(read_labels(info))
        past = [row[0] for row in rows if row[0] >= info.d_sae]
        if past:
            raise SAEFormatError(
                f"{LABELS_FILE}: entry '{past[0]}': feature {past[0]} is past the SAE's width "
                f"({info.d_sae} features: 0..{info.d_sae - 1})"
            )
        if seed_labels(self.store, info.id, rows):
            self._changed(info.id)
            log.info("%s: %d labels imported from its feature_labels.json", info.id, len(rows))

    def seed_quietly(self, info: SAEInfo) -> None:
        """`seed` at start-up, for SAEs registered before labels were stored: a bad file is
        logged, not fatal."""
        try:
            self.seed(info)
        except MillmError as exc:
            log.warning("%s: its feature labels were not imported: %s", info.id, exc.message)


def labelled(features: list[dict], labels: Mapping[int, dict]) -> list[dict]:
    """Entries of a read (`index`, `value`, ...), each with its feature's `label` (None when the
    feature has none) from `labels` (index -> entry with "label", as LabelBook.entries gives)."""
    return [
        {**entry, "label": (labels.get(entry["index"]) or {}).get("label")} for entry in features
    ]
