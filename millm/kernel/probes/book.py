"""Saved probes: create, read, update, delete, import, export, and which are active, all-or-nothing.

Reads come from memory (a `Shelf`, see base.py), filled from the store at start and refreshed
after every write through the book, so a request naming a probe, and every request watched by
the active probes, never reads or parses the database. An active probe watches every chat and
text completion (never scoring, never embeddings); which probes are active is a column of the
probe's row, so it survives a restart and a rename.
"""

from __future__ import annotations

import uuid

from millm.errors import Conflict, NotFound
from millm.formats.probe_documents import validate_probe, validate_probe_import
from millm.kernel.books.base import Book, unique_names
from millm.store.database import Store
from millm.store.probes import (
    delete_probe,
    insert_probes,
    probe_rows,
    replace_probe,
    set_probe_active,
)

ID_PREFIX = "probe_"


def new_id() -> str:
    """A fresh probe id."""
    return ID_PREFIX + uuid.uuid4().hex[:12]


class ProbeBook(Book):
    """Probes in the store, found by id or by name."""

    def __init__(self, store: Store):
        self.store = store
        super().__init__()

    def _rows(self, ids: list[str] | None = None) -> list[dict]:
        return probe_rows(self.store, ids)

    def _parse(self, row: dict) -> dict:
        return row["document"]  # stored canonical: validated when it was written

    def _order(self, row: dict) -> object:
        return row["name"]  # the store's order (by name)

    def _missing(self, key: str) -> NotFound:
        return NotFound(f"no probe named or with id {key!r}", param="probe", code="probe_not_found")

    def create(self, document: dict) -> dict:
        """Store a new probe (409 probe_exists if the name is taken)."""
        doc = validate_probe(document)
        probe_id = new_id()
        with self.writing() as touched:
            self._refuse_taken(doc["name"])
            touched.add(probe_id)
            insert_probes(self.store, [(probe_id, doc)])
        return self.find(probe_id)

    def update(self, key: str, changes: dict) -> dict:
        """Replace fields of a probe's document (name, description, detector); validated whole."""
        with self.writing() as touched:
            row = self.find(key)
            doc = validate_probe({**row["document"], **changes})
            if doc["name"] != row["name"]:
                self._refuse_taken(doc["name"])
            touched.add(row["id"])
            replace_probe(self.store, row["id"], doc)
        return self.find(row["id"])

    def delete(self, key: str) -> dict:
        """Remove a probe (active or not); returns what was removed."""
        with self.writing() as touched:
            row = self.find(key)
            touched.add(row["id"])
            delete_probe(self.store, row["id"])
        return row

    def set_active(self, key: str, active: bool) -> dict:
        """Make a probe watch every generation request, or stop it."""
        with self.writing() as touched:
            row = self.find(key)
            touched.add(row["id"])
            set_probe_active(self.store, row["id"], active)
        return self.find(row["id"])

    def active(self) -> list[dict]:
        """The active probes' rows, by name."""
        return [dict(row) for row in self.shelf.rows if row["active"]]

    def any_active(self) -> bool:
        """Whether a probe is active, from the shelf in memory (never the store: the event loop
        asks)."""
        return any(row["active"] for row in self._shelf.rows)

    def import_documents(self, payload, on_conflict: str) -> list[dict]:
        """Import one document or a bundle atomically (inactive); on_conflict 'fail' (409) or
        'rename' (name-2, ...)."""
        docs = validate_probe_import(payload)
        with self.writing() as touched:
            taken = self.shelf.names()
            clashes = [d["name"] for d in docs if d["name"] in taken]
            if clashes and on_conflict == "fail":
                raise Conflict(
                    f"probes already exist with these names: {clashes}; import with "
                    "on_conflict=rename",
                    code="probe_exists",
                )
            names = unique_names([d["name"] for d in docs], taken)
            rows = [
                (new_id(), {**doc, "name": name}) for doc, name in zip(docs, names, strict=True)
            ]
            insert_probes(self.store, rows)
            touched.update(pid for pid, _ in rows)
        return [self.find(pid) for pid, _ in rows]

    def _refuse_taken(self, name: str) -> None:
        if name in self.shelf.by_name:
            raise Conflict(f"a probe named {name!r} exists", param="name", code="probe_exists")


def probe_view(row: dict) -> dict:
    """A stored probe as the API shows it."""
    return {
        "id": row["id"],
        "object": "probe",
        "name": row["name"],
        "active": row["active"],
        "document": row["document"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
