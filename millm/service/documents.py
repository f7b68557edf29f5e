"""Imported miStudio documents: clusters (with their persistent dial) and circuits, stored raw."""

from __future__ import annotations

import json
import uuid

from millm.errors import Conflict, InvalidRequest, NotFound
from millm.interp.mistudio import (
    authored_intensity,
    check_circuit,
    cluster_definitions,
    rung,
)
from millm.store.database import Store


def parse_raw(raw: bytes):
    """The JSON of an import body (its size was capped by MAX_IMPORT_BYTES before it was read)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the document is not valid JSON: {exc}") from None


def _unique_names(wanted: list[str], taken: set[str], on_conflict: str) -> list[str]:
    clashes = [name for name in wanted if name in taken]
    if clashes and on_conflict == "fail":
        raise Conflict(f"these names exist already: {clashes}; import with on_conflict=rename", code="name_exists")
    names = []
    for name in wanted:
        candidate, n = name, 2
        while candidate in taken:
            candidate, n = f"{name} ({n})", n + 1
        taken.add(candidate)
        names.append(candidate)
    return names


class DocumentBook:
    """Imported documents of one table (clusters or circuits), found by id or name, stored raw."""

    table: str
    kind: str  # cluster | circuit, for messages and error codes

    def __init__(self, store: Store):
        self.store = store

    def all(self) -> list[dict]:
        """Every row (id, name, raw, created_at, and the cluster dial)."""
        return self.store.documents(self.table)

    def find(self, key: str) -> dict:
        """A document by id or name, or 404 <kind>_not_found."""
        for row in self.all():
            if key in (row["id"], row["name"]):
                return row
        raise NotFound(f"no {self.kind} named or with id {key!r}", param=self.kind, code=f"{self.kind}_not_found")

    def document(self, row: dict) -> dict:
        """The parsed document of a row."""
        return json.loads(row["raw"])

    def delete(self, key: str) -> dict:
        """Remove a document."""
        row = self.find(key)
        self.store.delete_document(self.table, row["id"])
        return row


class ClusterBook(DocumentBook):
    """Imported cluster definitions: raw document, name and persistent dial."""

    table, kind = "clusters", "cluster"

    def __init__(self, store: Store, maximum: float):
        super().__init__(store)
        self.maximum = maximum

    def import_raw(self, raw: bytes, on_conflict: str, check=None) -> list[dict]:
        """Import a definition or a bundle atomically; a single definition keeps its exact bytes.
        `check(definitions)` may refuse them after validation, before anything is stored."""
        payload = parse_raw(raw)
        definitions = cluster_definitions(payload)
        if check is not None:
            check(definitions)
        single = definitions[0] is payload
        names = _unique_names([d["name"] for d in definitions], {r["name"] for r in self.all()}, on_conflict)
        rows = []
        for definition, name in zip(definitions, names):
            text = raw.decode("utf-8") if single and name == definition["name"] else json.dumps({**definition, "name": name})
            intensity = min(authored_intensity(definition), self.maximum)
            rows.append({"id": "clu_" + uuid.uuid4().hex[:12], "name": name, "raw": text, "intensity": intensity})
        self.store.insert_documents(self.table, rows)
        return [self.find(row["id"]) for row in rows]

    def set_intensity(self, key: str, intensity) -> dict:
        """The persistent dial, within [0, max]."""
        row = self.find(key)
        if isinstance(intensity, bool) or not isinstance(intensity, (int, float)) or not 0 <= intensity <= self.maximum:
            raise InvalidRequest(f"intensity must be a number in [0, {self.maximum:g}], got {intensity!r}", param="intensity")
        self.store.set_cluster_intensity(row["id"], float(intensity))
        return self.find(row["id"])


class CircuitBook(DocumentBook):
    """Imported circuit definitions, stored raw."""

    table, kind = "circuits", "circuit"

    def import_raw(self, raw: bytes, on_conflict: str) -> dict:
        """Import one circuit definition (validated whole), keeping its exact bytes."""
        document = parse_raw(raw)
        check_circuit(document)
        (name,) = _unique_names([document["name"]], {r["name"] for r in self.all()}, on_conflict)
        text = raw.decode("utf-8") if name == document["name"] else json.dumps({**document, "name": name})
        row = {"id": "cir_" + uuid.uuid4().hex[:12], "name": name, "raw": text}
        self.store.insert_documents(self.table, [row])
        return self.find(row["id"])

    @staticmethod
    def rung(document: dict) -> int:
        """The circuit's evidence rung."""
        return rung(document)
