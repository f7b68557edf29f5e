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

A `when` or an `abort` entry may define its probe itself: `"detector": {...}` beside the name, as
a probe document holds one (no saved probe needed).

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

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    WrapValidator,
    model_validator,
)

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


class RequestSteering(SteeringSpec):
    """millm's shape of a request's own steering: a profile document's steering part, whose
    schema states that no other key is taken (a request's unknown key is refused, where a stored
    document keeps its own)."""

    model_config = ConfigDict(json_schema_extra={"additionalProperties": False})


class InlineFeature(BaseModel):
    """One feature of the original miLLM's inline steering: an add at a strength (clamped to
    ±200 when applied, and counted as clamped)."""

    model_config = ConfigDict(extra="forbid")
    index: Annotated[int, Field(strict=True, ge=0)]
    strength: Annotated[float, Field(strict=True, allow_inf_nan=False)]


class InlineSteering(BaseModel):
    """The original miLLM's shape of a request's own steering, `{"sae_id"?, "features":
    [{"index", "strength"}]}`: adds on one SAE (the one attached when sae_id is left out);
    `features: []` asks for the unsteered model."""

    model_config = ConfigDict(extra="forbid")
    sae_id: Annotated[str, Field(min_length=1)] | None = None
    features: list[InlineFeature]

    @model_validator(mode="after")
    def _each_index_once(self):
        seen: set[int] = set()
        for number, feature in enumerate(self.features):
            if feature.index in seen:
                raise InvalidRequest(
                    f"features[{number}]: feature {feature.index} is listed twice; list each "
                    "feature once",
                    param=f"{STEERING_PARAM}.features[{number}].index",
                )
            seen.add(feature.index)
        if self.sae_id is not None and not self.features:
            raise InvalidRequest(
                'sae_id with no features: send features, or {"features": []} alone for the '
                "unsteered model",
                param=f"{STEERING_PARAM}.sae_id",
            )
        return self


def inline_shape(value: Any) -> bool:
    """Whether a request's steering is in the original miLLM's shape (features at the top)."""
    return isinstance(value, dict) and "features" in value and "steering" not in value


def _own_steering(value: Any, handler) -> SteeringSpec | InlineSteering:
    if inline_shape(value):
        try:
            return InlineSteering.model_validate(value)
        except ValidationError as exc:
            raise field_error(exc, value, STEERING_PARAM) from None
    return _millm_shape(value, lambda raw: RequestSteering.model_validate(raw))


def _millm_shape(value: Any, handler) -> SteeringSpec:
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
            '"vectors": [...], "abort": [...]} (the steering part of a profile document), or '
            '{"sae_id": ..., "features": [{"index": ..., "strength": ...}]}',
            param=STEERING_PARAM,
        )
    return spec


# A request's own `steering` field: a profile document's steering part, or the original miLLM's
# inline shape; unknown keys refused, a problem refused as a 400 naming its location.
OwnSteering = Annotated[RequestSteering | InlineSteering, WrapValidator(_own_steering)]
# A profile document's steering part alone (what a variant or a sweep stores).
_SPEC: TypeAdapter[SteeringSpec] = TypeAdapter(Annotated[SteeringSpec, WrapValidator(_millm_shape)])


def spec_dict(spec: SteeringSpec | InlineSteering) -> dict:
    """A checked steering spec in canonical form (the optional lists only when they hold
    something); the inline shape as the spec of its one entry (its strengths as sent: they are
    clamped, and counted, when applied)."""
    if isinstance(spec, InlineSteering):
        if not spec.features:
            return {"steering": []}
        features = [{"index": f.index, "strength": f.strength} for f in spec.features]
        return {"steering": [{"sae_id": spec.sae_id, "features": features}]}
    dumped = spec.model_dump(exclude_none=True)
    return {
        "steering": dumped["steering"],
        **{key: dumped[key] for key in OPTIONAL_LISTS if dumped[key]},
    }


def validate_spec(value: Any) -> dict:
    """A request's own steering (a profile document's steering part) in canonical form, or a 400
    naming the first problem's location."""
    return spec_dict(_SPEC.validate_python(value))


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
