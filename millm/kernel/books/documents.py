"""Imported miStudio documents: clusters (with their persistent dial) and circuits, stored raw."""

from __future__ import annotations

import json
import logging
import uuid

from millm.errors import Conflict, InvalidRequest, NotFound
from millm.formats.mistudio import (
    authored_intensity,
    check_circuit,
    cluster_definitions,
    rung,
)
from millm.kernel.books.base import Book, Shelf, unique_names
from millm.store.database import Store
from millm.store.documents import (
    delete_document,
    document_rows,
    insert_documents,
    set_document_intensity,
)

log = logging.getLogger(__name__)


def parse_raw(raw: bytes):
    """The JSON of an import body (its size was capped by MAX_IMPORT_BYTES before it was read)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the document is not valid JSON: {exc}") from None


def _refuse_clashes(wanted: list[str], taken: set[str], on_conflict: str) -> None:
    clashes = [name for name in wanted if name in taken]
    if clashes and on_conflict == "fail":
        raise Conflict(
            f"these names exist already: {clashes}; import with on_conflict=rename",
            code="name_exists",
        )


def stored_document(shelf: Shelf, row: dict) -> dict:
    """A row's parsed document from the shelf; parsed here only for a row the shelf does not hold as
    it is (or a damaged one, whose JSON error is raised again, as it was before documents were
    kept parsed)."""
    stored = shelf.by_id.get(row["id"])
    if stored is not None and stored["raw"] == row["raw"] and row["id"] in shelf.documents:
        return shelf.documents[row["id"]]
    return json.loads(row["raw"])


class DocumentBook(Book):
    """Imported documents of one table (clusters or circuits), found by id or name, stored raw.

    Rows and their parsed documents are read from memory (books.Shelf), filled from the store at
    start and refreshed from it after every write through the book.
    """

    table: str
    kind: str  # cluster | circuit, for messages and error codes

    def __init__(self, store: Store, maximum: float = 2.0):
        self.store, self.maximum = store, maximum  # the most a persistent dial may be
        super().__init__()

    def _rows(self, ids: list[str] | None = None) -> list[dict]:
        return document_rows(self.store, self.table, ids)

    def _order(self, row: dict) -> object:
        return row["created_at"]  # the store's order (oldest first)

    def _parse(self, row: dict) -> dict | None:
        try:
            return json.loads(row["raw"])
        except (
            ValueError
        ) as exc:  # a damaged row: parsed (and refused) again where it is used, as before
            log.warning(
                "the stored %s %r (%s) cannot be parsed: %s", self.kind, row["name"], row["id"], exc
            )
            return None

    def _missing(self, key: str) -> NotFound:
        return NotFound(
            f"no {self.kind} named or with id {key!r}",
            param=self.kind,
            code=f"{self.kind}_not_found",
        )

    def document(self, row: dict) -> dict:
        """The parsed document of a row: from memory while the row is stored as it is (shared:
        read it, never change it)."""
        return stored_document(self.shelf, row)

    def delete(self, key: str) -> dict:
        """Remove a document."""
        with self.writing() as touched:
            row = self.find(key)
            touched.add(row["id"])
            delete_document(self.store, self.table, row["id"])
        return row

    def _names(self, wanted: list[str], on_conflict: str) -> list[str]:
        """The names to store (renamed by books.unique_name), or 409 name_exists under
        on_conflict=fail."""
        taken = self.shelf.names()
        _refuse_clashes(wanted, taken, on_conflict)
        return unique_names(wanted, taken)

    def set_intensity(self, key: str, intensity) -> dict:
        """The persistent dial, within [0, max] (a circuit's is over its authored one)."""
        row = self.find(key)  # an unknown key is a 404 before the value is checked
        if (
            isinstance(intensity, bool)
            or not isinstance(intensity, (int, float))
            or not 0 <= intensity <= self.maximum
        ):
            raise InvalidRequest(
                f"intensity must be a number in [0, {self.maximum:g}], got {intensity!r}",
                param="intensity",
            )
        with self.writing() as touched:
            row = self.find(key)
            touched.add(row["id"])
            set_document_intensity(self.store, self.table, row["id"], float(intensity))
        return self.find(row["id"])


class ClusterBook(DocumentBook):
    """Imported cluster definitions: raw document, name and persistent dial."""

    table, kind = "clusters", "cluster"

    def import_raw(self, raw: bytes, on_conflict: str, check=None) -> list[dict]:
        """Import a definition or a bundle atomically; a single definition keeps its exact bytes.
        `check(definitions)` may refuse them after validation, before anything is stored."""
        payload = parse_raw(raw)
        definitions = cluster_definitions(payload)
        if check is not None:
            check(definitions)
        single = definitions[0] is payload
        with self.writing() as touched:
            names = self._names([d["name"] for d in definitions], on_conflict)
            rows: list[dict] = []
            for definition, name in zip(definitions, names, strict=True):
                text = (
                    raw.decode("utf-8")
                    if single and name == definition["name"]
                    else json.dumps({**definition, "name": name})
                )
                intensity = min(authored_intensity(definition), self.maximum)
                rows.append(
                    {
                        "id": "clu_" + uuid.uuid4().hex[:12],
                        "name": name,
                        "raw": text,
                        "intensity": intensity,
                    }
                )
            touched.update(row["id"] for row in rows)
            insert_documents(self.store, self.table, rows)
        return [self.find(row["id"]) for row in rows]


class CircuitBook(DocumentBook):
    """Imported circuit definitions, stored raw."""

    table, kind = "circuits", "circuit"

    def import_raw(self, raw: bytes, on_conflict: str) -> dict:
        """Import one circuit definition (validated whole), keeping its exact bytes."""
        document = parse_raw(raw)
        check_circuit(document)
        with self.writing() as touched:
            (name,) = self._names([document["name"]], on_conflict)
            text = (
                raw.decode("utf-8")
                if name == document["name"]
                else json.dumps({**document, "name": name})
            )
            row = {"id": "cir_" + uuid.uuid4().hex[:12], "name": name, "raw": text}
            touched.add(row["id"])
            insert_documents(self.store, self.table, [row])
        return self.find(row["id"])

    @staticmethod
    def rung(document: dict) -> int:
        """The circuit's evidence rung."""
        return rung(document)
