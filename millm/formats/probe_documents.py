"""The probe documents (millm.probe, millm.probe-bundle) as pydantic models: one definition
validates an import, an inline probe and an update, and states their JSON Schema."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import Discriminator, Field, Tag, ValidationError
from pydantic.json_schema import models_json_schema

from millm.errors import InvalidProbe, InvalidRequest
from millm.formats.detectors import (
    Detector,
    Strict,
)
from millm.formats.document_fields import (
    field_error,
    no_bools,
    problems,
    refused_by,
    unique,
)
from millm.formats.document_schemas import MAX_BUNDLE, MAX_DESCRIPTION, ProfileName

ProbeKind = Literal["millm.probe"]
ProbeBundleKind = Literal["millm.probe-bundle"]
ProbeVersion = Literal[1]
PROBE_KIND: ProbeKind = "millm.probe"
PROBE_BUNDLE_KIND: ProbeBundleKind = "millm.probe-bundle"
PROBE_VERSION: ProbeVersion = 1
Part = TypeVar("Part", bound=Strict)
PROBE_DETECTORS = ("FeatureDetector", "WeightedDetector", "LinearDetector")  # their schemas' names


class ProbeDocument(Strict):
    """A millm.probe document: a named detector."""

    kind: ProbeKind = PROBE_KIND
    version: Annotated[ProbeVersion, no_bools("1")] = PROBE_VERSION
    name: ProfileName
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] = ""
    detector: Detector


class ProbeBundle(Strict):
    """A millm.probe-bundle: 1-500 probes with distinct names."""

    kind: ProbeBundleKind
    version: Annotated[ProbeVersion, no_bools("1")] = PROBE_VERSION
    probes: Annotated[
        list[ProbeDocument],
        Field(min_length=1, max_length=MAX_BUNDLE),
        unique(lambda p: p.name, "names appear twice: {twice}"),
    ]


def _validated(model: type[Part], doc, what: str, prefix: str = "") -> Part:
    """`doc` as `model`, or InvalidProbe listing every problem with its location (the first one's
    is the param)."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        found = problems(exc, doc, prefix)
        raise InvalidProbe(
            f"invalid {what}: " + "; ".join(f"{where}: {problem}" for where, problem in found),
            param=found[0][0],
        ) from None


def validate_probe(doc, prefix: str = "") -> dict:
    """A valid document in canonical form (kind and version filled), or InvalidProbe listing every
    problem (locations led by `prefix`, e.g. "probes[2]" for a request's inline probe)."""
    return _validated(ProbeDocument, doc, "probe", prefix).model_dump(exclude_none=True)


class InlineProbe(Strict):
    """A probe defined in a request's `probes` field: a detector, and a name for its verdicts
    (optional)."""

    name: ProfileName | None = None
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION)] = ""
    detector: Detector


PROBES_PARAM = "probes"
MAX_REQUEST_PROBES = (
    16  # probes one request may name or define (each scores every position of every row)
)


def _saved_or_inline(value) -> str:
    return "saved" if isinstance(value, str) else "inline"


# One entry of a request's `probes`: a saved probe's name or id, or a probe defined inline.
ProbeRef = Annotated[
    Annotated[str, Field(min_length=1, description="a saved probe's name or id"), Tag("saved")]
    | Annotated[InlineProbe, Tag("inline")],
    Discriminator(_saved_or_inline),
]


def _refused_probes(exc: ValidationError, value) -> InvalidRequest:
    found = problems(exc, value, PROBES_PARAM)
    first = exc.errors()[0]
    if first["type"] == "too_long":
        return InvalidRequest(
            f"{PROBES_PARAM} lists {len(value)} probes; a request takes at most "
            f"{MAX_REQUEST_PROBES}",
            param=PROBES_PARAM,
        )
    if found[0][0] == PROBES_PARAM:  # the field itself is no list
        return field_error(exc, value, PROBES_PARAM)
    return InvalidProbe(
        "invalid probe: " + "; ".join(f"{where}: {problem}" for where, problem in found),
        param=found[0][0],
    )


# A request's `probes` field: an entry's problems are refused as an invalid probe, naming each
# location (`probes[2].detector.threshold`).
RequestProbes = Annotated[
    list[ProbeRef], Field(max_length=MAX_REQUEST_PROBES), refused_by(_refused_probes)
]


def validate_probe_import(payload) -> list[dict]:
    """One document or a bundle -> the canonical documents; any problem refuses the whole
    payload."""
    if isinstance(payload, dict) and payload.get("kind") == PROBE_BUNDLE_KIND:
        bundle = _validated(ProbeBundle, payload, "probe bundle")
        return [doc.model_dump(exclude_none=True) for doc in bundle.probes]
    return [validate_probe(payload)]


def probe_bundle(docs: list[dict]) -> dict:
    """A bundle document holding these probes."""
    return {"kind": PROBE_BUNDLE_KIND, "version": PROBE_VERSION, "probes": docs}


# Component name -> schema, for the served OpenAPI schema (nested models are components too).
PROBE_SCHEMAS: dict[str, dict] = models_json_schema(
    [(model, "validation") for model in (ProbeDocument, ProbeBundle, InlineProbe)],
    ref_template="#/components/schemas/{model}",
)[1]["$defs"]
