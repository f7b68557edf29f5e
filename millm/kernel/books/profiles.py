"""Saved steering profiles: create, read, update, delete, import and export, all-or-nothing.

Reads come from memory (a `Shelf`, see base.py) filled from the store at start and refreshed
from it after every write through the book, so a request naming a profile never reads or parses
the database. Documents stored in an older version are upgraded when the book opens (written
back as the current version, meaning exactly what they meant; see formats/profiles.py).
"""

from __future__ import annotations

import logging
import uuid

from millm.errors import Conflict, InvalidProfile, NotFound
from millm.formats.profiles import outdated, validate_import, validate_profile
from millm.kernel.books.base import Book, unique_names
from millm.store.database import Store
from millm.store.profiles import (
    delete_profile,
    insert_profiles,
    profile_rows,
    update_profile,
    upgrade_profiles,
)

log = logging.getLogger(__name__)


class ProfileBook(Book):
    """Profiles in the store, found by id or by name."""

    def __init__(self, store: Store):
        self.store = store
        upgrade_stored(store)
        super().__init__()

    def _rows(self, ids: list[str] | None = None) -> list[dict]:
        return profile_rows(self.store, ids)  # documents parsed by the store

    def _parse(self, row: dict) -> dict:
        return row["document"]

    def _order(self, row: dict) -> object:
        return row["name"]  # the store's order (by name)

    def _missing(self, key: str) -> NotFound:
        return NotFound(
            f"no profile named or with id {key!r}", param="profile", code="profile_not_found"
        )

    def create(self, document: dict) -> dict:
        """Store a new profile (409 if the name is taken)."""
        doc = validate_profile(document)
        profile_id = "prof_" + uuid.uuid4().hex[:12]
        with self.writing() as touched:
            self._refuse_taken(doc["name"])
            touched.add(profile_id)
            insert_profiles(self.store, [(profile_id, doc)])
        return self.find(profile_id)

    def update(self, key: str, changes: dict, revision: int | None = None) -> dict:
        """Replace fields of a profile's document (name, description, steering), applied to the
        stored document as the write commits and validated whole; with `revision`, 409
        revision_conflict unless nobody changed the profile since that revision was read."""
        with self.writing() as touched:
            row = self.find(key)
            if "name" in changes and changes["name"] != row["name"]:
                self._refuse_taken(changes["name"])

            def change(stored: dict) -> dict:
                return validate_profile({**stored, **changes})

            touched.add(row["id"])
            update_profile(self.store, row["id"], change, revision)
        return self.find(row["id"])

    def delete(self, key: str) -> dict:
        """Remove a profile; returns what was removed."""
        with self.writing() as touched:
            row = self.find(key)
            touched.add(row["id"])
            delete_profile(self.store, row["id"])
        return row

    def import_documents(self, payload, on_conflict: str) -> list[dict]:
        """Import one document or a bundle atomically; on_conflict 'fail' (409) or 'rename'
        (books.unique_name: name-2, ...)."""
        docs = validate_import(payload)
        with self.writing() as touched:
            taken = self.shelf.names()
            clashes = [d["name"] for d in docs if d["name"] in taken]
            if clashes and on_conflict == "fail":
                raise Conflict(
                    f"profiles already exist with these names: {clashes}; import with "
                    "on_conflict=rename",
                    code="profile_exists",
                )
            names = unique_names([d["name"] for d in docs], taken)
            rows = [
                ("prof_" + uuid.uuid4().hex[:12], {**doc, "name": name})
                for doc, name in zip(docs, names, strict=True)
            ]
            insert_profiles(self.store, rows)
            touched.update(pid for pid, _ in rows)
        return [self.find(pid) for pid, _ in rows]

    def _refuse_taken(self, name: str) -> None:
        if name in self.shelf.by_name:
            raise Conflict(f"a profile named {name!r} exists", param="name", code="profile_exists")


def upgrade_stored(store: Store) -> None:
    """Rewrite stored documents of an older version as the current one, in one transaction.

    A document that no longer validates (edited in the database by hand) is left exactly as it
    is and logged: nothing stored is lost, and requests naming it are refused as before.
    """
    upgraded = {}
    for row in profile_rows(store):
        if not outdated(row["document"]):
            continue
        try:
            upgraded[row["id"]] = validate_profile(row["document"])
        except InvalidProfile as exc:
            log.warning(
                "profile %s (%s) was kept as stored: it cannot be upgraded (%s)",
                row["id"],
                row["name"],
                exc.message,
            )
    if upgraded:
        upgrade_profiles(store, upgraded)
        log.info("upgraded %d stored profile documents to the current version", len(upgraded))
