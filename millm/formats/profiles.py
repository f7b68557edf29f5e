"""Profile documents: the versioned JSON a profile is stored, exported and imported as.

    {"kind": "millm.profile", "version": 2, "name": "...", "description": "...",
     "steering": [{"sae_id": "sae_...", "layer": 15,
                   "features": [{"index": 12, "op": "add", "strength": 8.0},
                                {"index": 7, "op": "clamp", "value": 3.0},
                                {"index": 9, "op": "ablate"},
                                {"index": 11, "op": "cap", "value": 5.0}],
                   "when": {"probe": "mentions-dinner", "tokens": null}}],
     "vectors": [{"vector_id": "vec_...", "op": "add", "strength": 8.0}],
     "abort": [{"probe": "some-probe"}]}

Version 1 is the same without `op` (every feature is added), `when`, `vectors` and `abort`: it
is read as version 2 with op "add" on every feature, which means exactly what it meant, and
written back as version 2 (`canonical` always writes the current version). A bundle is
{"kind": "millm.profile-bundle", "version": 2, "profiles": [<document>, ...]}. The format is
the pydantic models in document_schemas.py. Validation is pure and whole: a document is
accepted entirely or refused with every problem's location, so an import never stores half of
anything.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError, WrapValidator

from millm.errors import InvalidProfile, InvalidRequest
from millm.formats.document_fields import field_error, validate_document
from millm.formats.document_schemas import (
    BUNDLE_KIND,
    VERSION,
    ProfileBundle,
    ProfileDocument,
    SteeringSpec,
)

STEERING_PARAM = "steering"
OPTIONAL_LISTS = (
    "vectors",
    "abort",
)  # left out of the stored form when empty: a features-only profile reads as before


def canonical(doc: ProfileDocument) -> dict:
    """The stored form of a valid document: kind and the current version, every feature's op,
    floats, no unknown keys."""
    # optional fields (layer, when, tokens) absent rather than null
    dumped = doc.model_dump(exclude_none=True)
    stored = {
        "kind": dumped["kind"],
        "version": VERSION,
        "name": dumped["name"],
        "description": dumped["description"],
        "steering": dumped["steering"],
    }
    stored.update({key: dumped[key] for key in OPTIONAL_LISTS if dumped[key]})
    return stored


def validate_profile(doc) -> dict:
    """A valid document in canonical form, or InvalidProfile listing every problem."""
    return canonical(validate_document(ProfileDocument, doc, InvalidProfile, "profile"))


def validate_import(payload) -> list[dict]:
    """One document or a bundle -> the canonical documents; any problem refuses the whole
    payload."""
    if isinstance(payload, dict) and payload.get("kind") == BUNDLE_KIND:
        return [
            canonical(doc)
            for doc in validate_document(ProfileBundle, payload, InvalidProfile, "bundle").profiles
        ]
    return [validate_profile(payload)]


def _own_steering(value: Any, handler) -> SteeringSpec:
    try:
        spec = handler(value)
    except ValidationError as exc:
        raise field_error(exc, value, STEERING_PARAM) from None
    # Documents let unknown keys pass (a stored miStudio document keeps its own); a request's
    # steering must not: a misspelt or misplaced key dropped here would answer unsteered without a
    # word.
    unknown = first_unknown_key(value, spec.model_dump(), STEERING_PARAM)
    if unknown is not None:
        raise InvalidRequest(
            f"{unknown}: unknown field; a request's steering is "
            '{"steering": [{"sae_id": ..., "features": [{"index": ..., "strength": ...}]}], '
            '"vectors": [...], "abort": [...]} (the steering part of a profile document)',
            param=STEERING_PARAM,
        )
    return spec


# A request's own `steering` field: a profile document's steering part, unknown keys refused, a
# problem refused as a 400 naming its location.
OwnSteering = Annotated[SteeringSpec, WrapValidator(_own_steering)]
_OWN_STEERING: TypeAdapter[SteeringSpec] = TypeAdapter(OwnSteering)


def spec_dict(spec: SteeringSpec) -> dict:
    """A checked steering spec in canonical form (the optional lists only when they hold
    something)."""
    dumped = spec.model_dump(exclude_none=True)
    return {
        "steering": dumped["steering"],
        **{key: dumped[key] for key in OPTIONAL_LISTS if dumped[key]},
    }


def validate_spec(value: Any) -> dict:
    """A request's own steering (a profile document's steering part) in canonical form, or a 400
    naming the first problem's location."""
    return spec_dict(_OWN_STEERING.validate_python(value))


def first_unknown_key(raw: Any, known: Any, where: str) -> str | None:
    """The location of the first key in `raw` that the validated model's dump (`known`) lacks."""
    if isinstance(raw, dict) and isinstance(known, dict):
        for key, value in raw.items():
            if key not in known:
                return f"{where}.{key}"
            found = first_unknown_key(value, known[key], f"{where}.{key}")
            if found is not None:
                return found
    elif isinstance(raw, list) and isinstance(known, list) and len(raw) == len(known):
        for index, (value, kept) in enumerate(zip(raw, known, strict=True)):
            found = first_unknown_key(value, kept, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def outdated(doc: dict) -> bool:
    """Whether a stored document was written in an older version (and is read through
    `validate_profile`)."""
    return doc.get("version") != VERSION


def bundle(docs: list[dict]) -> dict:
    """A bundle document holding these profiles."""
    return {"kind": BUNDLE_KIND, "version": VERSION, "profiles": docs}
