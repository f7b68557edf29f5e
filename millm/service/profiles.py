"""Saved steering profiles: create, read, update, delete, import and export, all-or-nothing."""

from __future__ import annotations

import uuid

from millm.errors import Conflict, NotFound
from millm.interp.profiles import validate_import, validate_profile
from millm.store.database import Store


class ProfileBook:
    """Profiles in the store, found by id or by name."""

    def __init__(self, store: Store):
        self.store = store

    def all(self) -> list[dict]:
        """Every profile row, by name."""
        return self.store.profiles()

    def find(self, key: str) -> dict:
        """A profile by id or name, or 404 profile_not_found."""
        for row in self.store.profiles():
            if key in (row["id"], row["name"]):
                return row
        raise NotFound(f"no profile named or with id {key!r}", param="profile", code="profile_not_found")

    def _taken(self) -> set[str]:
        return {row["name"] for row in self.store.profiles()}

    def create(self, document: dict) -> dict:
        """Store a new profile (409 if the name is taken)."""
        doc = validate_profile(document)
        if doc["name"] in self._taken():
            raise Conflict(f"a profile named {doc['name']!r} exists", param="name", code="profile_exists")
        profile_id = "prof_" + uuid.uuid4().hex[:12]
        self.store.insert_profiles([(profile_id, doc)])
        return self.find(profile_id)

    def update(self, key: str, changes: dict) -> dict:
        """Replace fields of a profile's document (name, description, steering); validated whole."""
        row = self.find(key)
        doc = validate_profile({**row["document"], **changes})
        if doc["name"] != row["name"] and doc["name"] in self._taken():
            raise Conflict(f"a profile named {doc['name']!r} exists", param="name", code="profile_exists")
        self.store.replace_profile(row["id"], doc)
        return self.find(row["id"])

    def delete(self, key: str) -> dict:
        """Remove a profile; returns what was removed."""
        row = self.find(key)
        self.store.delete_profile(row["id"])
        return row

    def import_documents(self, payload, on_conflict: str) -> list[dict]:
        """Import one document or a bundle atomically; on_conflict 'fail' (409) or 'rename' (name-2, name-3, ...)."""
        docs = validate_import(payload)
        taken = self._taken()
        clashes = [d["name"] for d in docs if d["name"] in taken]
        if clashes and on_conflict == "fail":
            raise Conflict(f"profiles already exist with these names: {clashes}; import with on_conflict=rename", code="profile_exists")
        rows = []
        for doc in docs:
            name, n = doc["name"], 2
            while name in taken:
                name, n = f"{doc['name'][:110]}-{n}", n + 1
            taken.add(name)
            rows.append(("prof_" + uuid.uuid4().hex[:12], {**doc, "name": name}))
        self.store.insert_profiles(rows)
        return [self.find(pid) for pid, _ in rows]
