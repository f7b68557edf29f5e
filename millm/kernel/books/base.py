"""What the books of stored documents share: an in-memory shelf of a table's rows, and the rename
rule.

Every request may read a profile, cluster or circuit (its own `profile`, or the active base),
so the books keep the rows, and each row's parsed document, in memory: a `Shelf` is an
immutable snapshot of one table, replaced whole after every write that goes through its book
(a reader holding a shelf sees one consistent table, never a half-applied write). The store
stays the source of truth: a shelf is filled from it when the book is made, and after each
write the rows it touched are read back from it (those it no longer has are dropped), so a
write costs the rows it wrote, not the table.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from millm.errors import MillmError

NAME_LIMIT = 120  # profile, cluster and circuit names are 1-120 characters

Parse = Callable[[dict], "dict | None"]  # a row's document, None if it does not parse
Order = Callable[[dict], Any]  # the store's order of a table's rows, as a sort key


@dataclass(frozen=True)
class Shelf:
    """One table's rows as of one revision, by id and by name, with each row's parsed document."""

    revision: int
    rows: tuple[dict, ...] = ()
    by_id: Mapping[str, dict] = field(default_factory=dict)
    by_name: Mapping[str, dict] = field(default_factory=dict)
    # id -> parsed document; absent if it does not parse
    documents: Mapping[str, dict] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        rows: list[dict],
        revision: int,
        parse: Parse,
        order: Order,
        parsed: Mapping[str, dict] | None = None,
    ) -> Shelf:
        """A shelf of these rows; `parsed` holds documents already parsed (by id), the rest go
        through `parse`."""
        documents = dict(parsed or {})
        for row in rows:
            if row["id"] not in documents:
                document = parse(row)
                if document is not None:
                    documents[row["id"]] = document
        ordered = tuple(sorted(rows, key=order))
        return cls(
            revision,
            ordered,
            {r["id"]: r for r in ordered},
            {r["name"]: r for r in ordered},
            documents,
        )

    def updated(self, ids: set[str], fresh: list[dict], parse: Parse, order: Order) -> Shelf:
        """The next shelf: the rows of `ids` replaced by `fresh` (read back from the store;
        absent ones dropped)."""
        kept = [row for row in self.rows if row["id"] not in ids]
        parsed = {key: document for key, document in self.documents.items() if key not in ids}
        return Shelf.of(kept + fresh, self.revision + 1, parse, order, parsed)

    def get(self, key: str) -> dict | None:
        """The row with this id, else the one with this name (an id first: a name may look like
        another row's id)."""
        return self.by_id.get(key) or self.by_name.get(key)

    def names(self) -> set[str]:
        """Every name in use (a new set, for the caller to add to)."""
        return set(self.by_name)


class Book(ABC):
    """A stored table read from a shelf: subclasses say how to read rows, parse a document and
    order rows."""

    def __init__(self) -> None:
        # One write (and the read-back after it) at a time: no shelf is built from a stale one, and
        # a name is checked free and taken in one step. Readers never take it (unless a write
        # failed).
        self._writing = threading.RLock()
        self._shelf = Shelf(0)
        self._stale = False
        self._reload()

    @abstractmethod
    def _rows(self, ids: list[str] | None = None) -> list[dict]:
        """The stored rows (all, or those with these ids)."""

    @abstractmethod
    def _parse(self, row: dict) -> dict | None:
        """A row's parsed document (None when it has none)."""

    @abstractmethod
    def _order(self, row: dict) -> object:
        """A row's sort key, the store's order."""

    @abstractmethod
    def _missing(self, key: str) -> MillmError:
        """The 404 for a key no row has."""

    def all(self) -> list[dict]:
        """Every row, in the store's order (profiles by name, documents oldest first)."""
        return [dict(row) for row in self.shelf.rows]

    def find(self, key: str) -> dict:
        """A row by id or name, or the book's 404. A miss reads the store once more first: another
        replica may have created the row a moment ago, before its notice arrived here."""
        shelf = self.shelf
        if shelf.get(key) is None:
            self.refresh()
            shelf = self.shelf
        return dict(self.find_in(shelf, key))

    def find_in(self, shelf: Shelf, key: str) -> dict:
        """A row of this shelf by id or name (shared: read it, never change it), or the book's
        404."""
        row = shelf.get(key)
        if row is None:
            raise self._missing(key)
        return row

    @property
    def shelf(self) -> Shelf:
        """The rows as of now (immutable: a reader needing several lookups to agree keeps one)."""
        if self._stale:  # only after a write that failed midway: the store is read again
            with self._writing:
                if self._stale:
                    self._reload()
        return self._shelf

    def refresh(self) -> None:
        """Read the whole table again: another replica changed it
        (kernel/runtime/replication.py)."""
        with self._writing:
            self._reload()

    def _reload(self) -> None:
        self._shelf = Shelf.of(self._rows(), self._shelf.revision + 1, self._parse, self._order)
        self._stale = False

    @contextmanager
    def writing(self) -> Iterator[set[str]]:
        """Around every write through the book, one at a time: the write adds the ids it touches to
        the yielded set, and those rows are read back from the store into the next shelf after it.

        A MillmError is a refusal, which the books raise only before their store call: nothing
        changed. Any other error leaves the store unknown: the whole table is read again by the next
        reader.
        """
        with self._writing:
            if self._stale:
                self._reload()
            touched: set[str] = set()
            try:
                yield touched
            except MillmError:
                raise
            except BaseException:
                self._stale = True
                raise
            try:
                if touched:
                    self._shelf = self._shelf.updated(
                        touched, self._rows(sorted(touched)), self._parse, self._order
                    )
            except BaseException:
                self._stale = True
                raise


def unique_name(name: str, taken: set[str], limit: int = NAME_LIMIT) -> str:
    """The rename rule of every import: `name` if free, else the first free of name-2, name-3, ...

    The name is cut so that name and suffix stay within `limit` characters. "-N" rather than
    " (N)": parentheses are not allowed in profile names, and the rule is one for all kinds.
    """
    candidate, n = name, 2
    while candidate in taken:
        suffix = f"-{n}"
        candidate, n = name[: limit - len(suffix)] + suffix, n + 1
    return candidate


def unique_names(wanted: list[str], taken: set[str]) -> list[str]:
    """unique_name for each in turn, each new name taken before the next (a bundle never clashes
    with itself)."""
    names = []
    for name in wanted:
        names.append(unique_name(name, taken))
        taken.add(names[-1])
    return names
