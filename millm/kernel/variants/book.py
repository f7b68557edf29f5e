"""Stored variants, read from memory: a request naming one never reads the database.

A variant's document is what a /v1 request naming it would otherwise send: a saved `profile` or
its own `steering` (canonical, as v1/serving/prechecks.py keeps a request's), a
`steering_intensity`, and how `scoring` runs. Refusals of the document itself (its syntax) are
made here, before anything is stored; whether it fits the attached SAEs is naming.py's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from millm.errors import Conflict, InvalidRequest, NotFound
from millm.formats.profiles import validate_spec
from millm.interp.intensity import Dial, parse_dial
from millm.kernel.books.base import Book
from millm.store.database import Store
from millm.store.variants import delete_variant, insert_variant, update_variant, variant_rows

PREFIX = "var_"
MAX_VARIANTS = 500  # each is a line of /v1/models: past a few hundred a model picker is unusable


@dataclass(frozen=True)
class ParsedVariant:
    """One variant as requests use it: its base and its steering, parsed once."""

    id: str
    name: str
    base: str
    profile: str | None
    spec: dict | None
    dial: Dial | None
    scoring: str  # unsteered | steered

    @property
    def steers_scoring(self) -> bool:
        """Whether scoring requests naming it are steered (its `scoring` is steered)."""
        return self.scoring == "steered"


def variant_document(fields: dict) -> dict:
    """A variant's stored document from its fields (exactly one of profile and steering), or a
    400 naming the field."""
    profile, steering = fields.get("profile"), fields.get("steering")
    if (profile is None) == (steering is None):
        raise InvalidRequest(
            "a variant is steered by exactly one of profile (a saved profile) and steering (a "
            "request's own steering)",
            param="steering" if steering is not None else "profile",
        )
    intensity = fields.get("steering_intensity")
    if intensity is not None:
        parse_dial(intensity)
    document = {
        "description": fields.get("description") or "",
        "steering_intensity": intensity,
        "scoring": fields.get("scoring") or "unsteered",
    }
    if profile is not None:
        document["profile"] = profile
    else:
        document["steering"] = validate_spec(steering)
    return document


def parsed(row: dict) -> ParsedVariant:
    """A stored row as a Variant."""
    doc = row["document"]
    intensity = doc.get("steering_intensity")
    return ParsedVariant(
        id=row["id"],
        name=row["name"],
        base=row["base"],
        profile=doc.get("profile"),
        spec=doc.get("steering"),
        dial=parse_dial(intensity) if intensity is not None else None,
        scoring=doc.get("scoring", "unsteered"),
    )


class VariantBook(Book):
    """Variants in the store, found by id or name (names are unique, and no model has one)."""

    def __init__(self, store: Store, limit: int = MAX_VARIANTS):
        self.store, self.limit = store, limit
        super().__init__()

    # Book -----------------------------------------------------------------------------------------
    def _rows(self, ids: list[str] | None = None) -> list[dict]:
        return variant_rows(self.store, ids)

    def _parse(self, row: dict) -> dict | None:
        try:
            return {"variant": parsed(row)}
        except InvalidRequest:  # edited by hand into something unreadable: kept, refused by name
            return None

    def _order(self, row: dict) -> object:
        return row["name"]

    def _missing(self, key: str) -> NotFound:
        return NotFound(
            f"no variant named or with id {key!r}", param="name", code="variant_not_found"
        )

    # reads ----------------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        """Whether a variant has this name."""
        return name in self.shelf.by_name

    def named(self, name: str) -> ParsedVariant | None:
        """The variant a request's `model` names (by name only, from memory), None when none has
        it."""
        shelf = self.shelf
        row = shelf.by_name.get(name)
        if row is None:
            return None
        document = shelf.documents.get(row["id"])
        if document is None:
            raise InvalidRequest(
                f"the stored definition of variant {name!r} cannot be read; fix or delete it at "
                "/api/variants",
                param="model",
                code="variant_unfit",
            )
        return document["variant"]

    # writes ---------------------------------------------------------------------------------------
    def create(self, name: str, base: str, document: dict) -> dict:
        """Store a new variant (409 variant_exists for a taken name, 409 variants_full past the
        limit)."""
        variant_id = PREFIX + uuid.uuid4().hex[:12]
        with self.writing() as touched:
            if len(self.shelf.rows) >= self.limit:
                raise Conflict(
                    f"{len(self.shelf.rows)} variants are stored, the most this server keeps; "
                    "delete one first",
                    code="variants_full",
                )
            self._refuse_taken(name)
            touched.add(variant_id)
            insert_variant(self.store, variant_id, name, base, document)
        return self.find(variant_id)

    def update(self, key: str, name: str, base: str, document: dict) -> dict:
        """Replace a variant's name, base and document."""
        with self.writing() as touched:
            row = self.find(key)
            if name != row["name"]:
                self._refuse_taken(name)
            touched.add(row["id"])
            update_variant(self.store, row["id"], name, base, document)
        return self.find(row["id"])

    def delete(self, key: str) -> dict:
        """Forget a variant; returns what was removed."""
        with self.writing() as touched:
            row = self.find(key)
            touched.add(row["id"])
            delete_variant(self.store, row["id"])
        return row

    def _refuse_taken(self, name: str) -> None:
        if name in self.shelf.by_name:
            raise Conflict(f"a variant named {name!r} exists", param="name", code="variant_exists")
