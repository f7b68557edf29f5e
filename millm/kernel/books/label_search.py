"""Ranked search over one SAE's feature labels: SQLite FTS5 with BM25, in memory.

Each SAE's labels go into an in-memory FTS5 table (python's sqlite3, `:memory:`, tokenizer `porter
unicode61`: case and accents folded, English words stemmed) with three columns: the label, the top
tokens and other explanations a source gave, and an example's context and a description, weighted by
WEIGHTS. The user's text never reaches FTS5's query syntax: `fts_query` keeps its words only, each
quoted and prefix-matched, joined with OR, so quotes, `*`, `NEAR` or `AND` are words like any other,
and a label that matches some of the words still ranks, below one that matches more.

The score is BM25 as SQLite computes it, negated: larger is better (SQLite's `bm25()` is smaller
for better matches), times the row's weight: 1 for a label a file or a user brought, and for a
model's explanation twice its detection balanced accuracy (chance, 0.5, weighs 1; an explanation
the scorer could use perfectly weighs 2; one worse than chance less than 1), so a well-scored
explanation ranks above a poorly scored one that matches the words as well.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from typing import Any

from pydantic import BaseModel

# BM25 column weights: a word in the label counts most, then the top tokens and other explanations,
# then an example's context (which holds many words the feature is not about). Chosen on the demo
# SAE's labels: "pirate", "italian food", "France paris" and "music song" each rank a feature its
# demo profile of that name uses among the first three.
WEIGHTS = (4.0, 2.0, 0.5)
MAX_WORDS = 32  # of the query; the rest are ignored (a query is a few words, not a document)
WORD = re.compile(r"[^\W_]+")  # letters and digits: what unicode61 keeps as token characters


class FeatureMatch(BaseModel):
    """A labelled feature found by a search: its index, label, score (larger is better; null when
    the query is empty) and source ("explained" for a model's explanation, with its detection
    balanced accuracy)."""

    index: int
    label: str
    score: float | None
    source: str
    balanced_accuracy: float | None = None


def fts_query(text: str) -> str | None:
    """The user's words as a safe FTS5 query ("w1"* OR "w2"* ...), or None when it has no words."""
    words = list(dict.fromkeys(word.lower() for word in WORD.findall(text)))[:MAX_WORDS]
    return " OR ".join(f'"{word}"*' for word in words) or None


def _texts(detail: dict[str, Any], keys: tuple[str, ...]) -> str:
    parts: list[str] = []
    for key in keys:
        value = detail.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts.extend(str(item) for item in value)
    return "\n".join(parts)


def search_texts(detail: dict[str, Any]) -> tuple[str, str]:
    """The text beside a label that a search reads: (top tokens, other explanations and a category;
    an example and a description)."""
    return _texts(detail, ("top_tokens", "others", "category")), _texts(
        detail, ("example", "description")
    )


class LabelIndex:
    """One SAE's labels in an in-memory FTS5 table; safe to search from several threads."""

    def __init__(
        self,
        rows: list[tuple[int, str, str, tuple[str, str]]],
        accuracies: dict[int, float] | None = None,
    ):
        """`rows`: (feature, label, source, search_texts of its detail); `accuracies`: the detection
        balanced accuracy of the features whose label is a model's explanation."""
        self._accuracies = accuracies or {}
        self._lock = threading.Lock()
        # check_same_thread=False: worker-pool and job threads share it, one at a time under the
        # lock.
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            "CREATE VIRTUAL TABLE labels USING fts5(label, also, context, source UNINDEXED, "
            "tokenize = 'porter unicode61')"
        )
        values = [
            (feature, label, source, also, context)
            for feature, label, source, (also, context) in rows
        ]
        self._db.executemany(
            "INSERT INTO labels (rowid, label, source, also, context) VALUES (?, ?, ?, ?, ?)",
            values,
        )
        self._db.commit()

    def search(self, query: str, limit: int) -> list[FeatureMatch]:
        """The best `limit` labels for `query`, best first (ties by index); [] when it has no
        words."""
        match = fts_query(query)
        if match is None:
            return []
        sql = (
            f"SELECT rowid, label, source, bm25(labels, {', '.join(map(str, WEIGHTS))}) AS rank "
            "FROM labels WHERE labels MATCH ?"
        )
        with self._lock:
            found = self._db.execute(sql, (match,)).fetchall()
        matches = [
            FeatureMatch(
                index=row[0],
                label=row[1],
                source=row[2],
                score=-row[3] * 2 * self._accuracies.get(row[0], 0.5),
                balanced_accuracy=self._accuracies.get(row[0]),
            )
            for row in found
        ]
        matches.sort(key=lambda m: (-(m.score or 0.0), m.index))
        return matches[:limit]

    def close(self) -> None:
        """Free the table."""
        with self._lock:
            self._db.close()
