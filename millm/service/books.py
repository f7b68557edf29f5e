"""What the books of stored documents share: an in-memory shelf of a table's rows, and the rename rule.

Every request may read a profile, cluster or circuit (its own `profile`, or the active base),
so the books keep the rows, and each row's parsed document, in memory: a `Shelf` is an
immutable snapshot of one table, replaced whole after every write that goes through its book
(a reader holding a shelf sees one consistent table, never a half-applied write). The store
stays the source of truth: a shelf is filled from it when the book is made and again after
each write, never patched by hand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from millm.errors import MillmError

NAME_LIMIT = 120  # profile, cluster and circuit names are 1-120 characters


@dataclass(frozen=True)
class Shelf:
    """One table's rows as of one revision, by id and by name, with each row's parsed document."""

    revision: int
    rows: tuple[dict, ...] = ()
    by_id: Mapping[str, dict] = field(default_factory=dict)
    by_name: Mapping[str, dict] = field(default_factory=dict)
    documents: Mapping[str, dict] = field(default_factory=dict)  # id -> parsed document; absent if it does not parse

    @classmethod
    def of(cls, rows: list[dict], revision: int, parse: Callable[[dict], dict | None]) -> Shelf:
        """A shelf of these rows (in the store's order); `parse` gives a row's document, None if unreadable."""
        documents = {}
        for row in rows:
            document = parse(row)
            if document is not None:
                documents[row["id"]] = document
        return cls(revision, tuple(rows), {r["id"]: r for r in rows}, {r["name"]: r for r in rows}, documents)

    def get(self, key: str) -> dict | None:
        """The row with this id, else the one with this name (an id first: a name may look like another row's id)."""
        return self.by_id.get(key) or self.by_name.get(key)

    def names(self) -> set[str]:
        """Every name in use (a new set, for the caller to add to)."""
        return set(self.by_name)


class Book:
    """A stored table read from a shelf: subclasses say how to read the rows and parse a row's document."""

    def __init__(self) -> None:
        # One write (and the reload after it) at a time: reloads are never lost to a race, and a
        # name is checked free and taken in one step. Readers never take it (unless a write failed).
        self._writing = threading.RLock()
        self._shelf = Shelf(0)
        self._stale = False
        self._reload()

    def _rows(self) -> list[dict]:
        raise NotImplementedError

    def _parse(self, row: dict) -> dict | None:
        raise NotImplementedError

    def _missing(self, key: str) -> MillmError:
        raise NotImplementedError

    def all(self) -> list[dict]:
        """Every row, in the store's order (profiles by name, documents oldest first)."""
        return [dict(row) for row in self.shelf.rows]

    def find(self, key: str) -> dict:
        """A row by id or name, or the book's 404."""
        return dict(self.find_in(self.shelf, key))

    def find_in(self, shelf: Shelf, key: str) -> dict:
        """A row of this shelf by id or name (shared: read it, never change it), or the book's 404."""
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

    def _reload(self) -> None:
        self._shelf = Shelf.of(self._rows(), self._shelf.revision + 1, self._parse)
        self._stale = False

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Around every write through the book: one at a time, and the shelf reloaded from the store after it.

        A MillmError is a refusal, which the books raise only before their store call: nothing to reload.
        """
        with self._writing:
            if self._stale:
                self._reload()
            try:
                yield
            except MillmError:
                raise
            except BaseException:
                self._stale = True  # the store may have changed or not: the next reader reads it again
                raise
            try:
                self._reload()
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
    """unique_name for each in turn, each new name taken before the next (a bundle never clashes with itself)."""
    names = []
    for name in wanted:
        names.append(unique_name(name, taken))
        taken.add(names[-1])
    return names
