"""Profile documents: the versioned JSON a profile is stored, exported and imported as.

    {"kind": "millm.profile", "version": 1, "name": "...", "description": "...",
     "steering": [{"sae_id": "sae_...", "layer": 15, "features": [{"index": 12, "strength": 8.0}]}]}

A bundle is {"kind": "millm.profile-bundle", "version": 1, "profiles": [<document>, ...]}.
The format is the pydantic models in document_schemas.py. Validation is pure and whole: a document
is accepted entirely or refused with every problem's location, so an import never stores half of
anything.
"""

from __future__ import annotations

from millm.errors import InvalidProfile
from millm.interp.document_schemas import (
    BUNDLE_KIND,
    VERSION,
    ProfileBundle,
    ProfileDocument,
    validate_document,
)


def canonical(doc: ProfileDocument) -> dict:
    """The stored form of a valid document: kind and version filled, floats for strengths, no unknown keys."""
    return doc.model_dump(exclude_none=True)  # layer is the only optional field: absent rather than null


def validate_profile(doc) -> dict:
    """A valid document in canonical form, or InvalidProfile listing every problem."""
    return canonical(validate_document(ProfileDocument, doc, InvalidProfile, "profile"))


def validate_import(payload) -> list[dict]:
    """One document or a bundle -> the canonical documents; any problem refuses the whole payload."""
    if isinstance(payload, dict) and payload.get("kind") == BUNDLE_KIND:
        return [canonical(doc) for doc in validate_document(ProfileBundle, payload, InvalidProfile, "bundle").profiles]
    return [validate_profile(payload)]


def profile_strengths(doc: dict) -> dict[str, dict[int, float]]:
    """sae_id -> {feature: strength} of a (valid) document."""
    return {entry["sae_id"]: {f["index"]: f["strength"] for f in entry["features"]} for entry in doc["steering"]}


def bundle(docs: list[dict]) -> dict:
    """A bundle document holding these profiles."""
    return {"kind": BUNDLE_KIND, "version": VERSION, "profiles": docs}
