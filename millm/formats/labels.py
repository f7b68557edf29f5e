"""Feature-label documents: reading the formats labels come in, and writing them back out.

Formats read (each a pydantic model and one function; `detect_format` tells them apart):

- `neuronpedia`: Neuronpedia's explanation export, a JSON list of `{modelId, layer, index,
  description, explanationModelName, typeName, ...}`, `index` a string of digits, several per
  feature possible.
- `neuronpedia_feature`: Neuronpedia's per-feature answer (`/api/feature/{model}/{layer}/{index}`),
  `{index, explanations: [{description, explanationModelName, ...}], ...}`, one object or a list.
- `mistudio`: miStudio's label export, the `explanations/explanations.json` of its Neuronpedia
  export package: `{"explanations": [{"feature_index", "explanations": [{"description", "method",
  "score", "created_at"}]}]}`.
- `json`: a plain `{"<index>": "label"}` object; a value may also be an object with a `label` (the
  shape of an SAE's own feature_labels.json: label, top_tokens, example, frequency, ...).
- `csv`: `index,label` rows, with an optional header row whose first cell is `index`.

Rules where the formats leave a choice:

- Several explanations of one feature (Neuronpedia, miStudio): the first non-empty description in
  document order is the label; its explainer (model name, type, method, score) is kept in the
  detail, and the other non-empty descriptions under `others`.
- Descriptions and labels are stripped of surrounding white space. An empty label (after stripping)
  is no label: the entry is skipped and counted, never stored, and it never removes a stored label.
- A CSV index that appears twice is refused (a JSON object cannot hold a key twice).
- Every problem names its entry: `entry 12` (the position in a JSON list, from 0), `entry '12'` (the
  key of a plain object), `row 3` (the line of a CSV file, from 1).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from millm.errors import InvalidFeatureIndex, InvalidRequest
from millm.formats.label_formats import (
    DIGITS,
    MISTUDIO,
    NEURONPEDIA,
    NEURONPEDIA_FEATURES,
    PLAIN,
    NeuronpediaFeature,
)

LabelFormat = Literal["neuronpedia", "neuronpedia_feature", "mistudio", "json", "csv"]
ExportFormat = Literal["json", "csv", "neuronpedia", "mistudio"]
FORMATS: tuple[str, ...] = ("neuronpedia", "neuronpedia_feature", "mistudio", "json", "csv")
TOP_TOKENS = "top_tokens"  # labels millm made from a calibration's top examples: format and source
SOURCES = {
    "neuronpedia": "neuronpedia",
    "neuronpedia_feature": "neuronpedia",
    "mistudio": "mistudio",
    "json": "plain",
    "csv": "plain",
    TOP_TOKENS: TOP_TOKENS,  # made by millm from a calibration (lab/labels/top_tokens.py)
}
CODE = "invalid_labels"
PROBLEMS_SHOWN = 5  # a document with thousands of bad entries is described by its first few


@dataclass(frozen=True)
class Label:
    """One feature's label, what its source said beside it, and where it was in the document."""

    index: int
    label: str
    detail: dict[str, Any] = field(default_factory=dict)
    entry: str = field(default="", compare=False)


@dataclass(frozen=True)
class LabelDocument:
    """A document read whole: its format, one label per feature (by index) and how many entries
    had none."""

    format: str
    labels: list[Label]
    skipped: int = 0

    @property
    def source(self) -> str:
        """What the store records as the labels' source: neuronpedia, mistudio, plain or
        top_tokens."""
        return SOURCES[self.format]


def refused(message: str) -> InvalidRequest:
    """A bad labels document: 400 invalid_labels."""
    return InvalidRequest(message, code=CODE)


# ---- problems, named by entry --------------------------------------------------------------------
def _entry(loc: tuple, plain: bool) -> tuple[str, str]:
    """('entry 12', 'explanations[0].description') from pydantic's location."""
    parts = list(loc)
    if parts and parts[0] == "explanations" and len(parts) > 1 and isinstance(parts[1], int):
        parts = parts[1:]  # miStudio: the features are the list under "explanations"
    entry = ""
    if parts and (isinstance(parts[0], int) or plain):
        first = parts.pop(0)
        entry = f"entry {first}" if isinstance(first, int) else f"entry {first!r}"
    path = ""
    for part in parts:
        if part == "[key]":
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return entry, path


def _problem(error: ErrorDetails, plain: bool) -> str:
    entry, path = _entry(tuple(error["loc"]), plain)
    if error["type"] in ("feature_index", "label_value"):
        what = error["msg"]
    else:
        what = f"{path}: {error['msg']}" if path else error["msg"]
        value = error.get("input")
        if (
            error["type"] != "missing"
            and isinstance(value, (str, int, float))
            and len(json.dumps(value)) <= 40
        ):
            what += f" (got {json.dumps(value)})"
    return f"{entry}: {what}" if entry else what


def _validated(adapter: TypeAdapter, doc: Any, what: str, plain: bool = False) -> Any:
    try:
        return adapter.validate_python(doc)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        listed = "; ".join(_problem(e, plain) for e in errors[:PROBLEMS_SHOWN])
        more = len(errors) - PROBLEMS_SHOWN
        raise refused(
            f"invalid {what}: {listed}" + (f" (and {more} more problems)" if more > 0 else "")
        ) from None


# ---- choosing among explanations -----------------------------------------------------------------
def _chosen(
    index: int,
    entry: str,
    explanations: list[tuple[str | None, dict[str, Any]]],
    context: dict[str, Any],
) -> Label | None:
    """The first non-empty description with its explainer's detail (others kept), or None when
    all are empty."""
    found = [(text.strip(), detail) for text, detail in explanations if text and text.strip()]
    if not found:
        return None
    (label, detail), others = (
        found[0],
        list(dict.fromkeys(text for text, _ in found[1:] if text != found[0][0])),
    )
    kept = {key: value for key, value in {**context, **detail}.items() if value is not None}
    if others:
        kept["others"] = others
    return Label(index, label, kept, entry)


def _collected(
    groups: dict[int, tuple[str, list[tuple[str | None, dict[str, Any]]], dict[str, Any]]], fmt: str
) -> LabelDocument:
    labels, skipped = [], 0
    for index in sorted(groups):
        entry, explanations, context = groups[index]
        label = _chosen(index, entry, explanations, context)
        if label is None:
            skipped += 1
        else:
            labels.append(label)
    return LabelDocument(fmt, labels, skipped)


# ---- one function per format ---------------------------------------------------------------------
def read_neuronpedia(doc: Any) -> LabelDocument:
    """Neuronpedia's explanation export (a list; several explanations per index possible)."""
    items = _validated(NEURONPEDIA, doc, "Neuronpedia explanation export")
    groups: dict[int, tuple[str, list, dict]] = {}
    for position, item in enumerate(items):
        detail = {"explainer": item.explanationModelName, "type": item.typeName}
        context = {"model_id": item.modelId, "neuronpedia_layer": item.layer}
        groups.setdefault(item.index, (f"entry {position}", [], context))[1].append(
            (item.description, detail)
        )
    return _collected(groups, "neuronpedia")


def read_neuronpedia_features(doc: Any) -> LabelDocument:
    """Neuronpedia's per-feature answer, one object or a list of them."""
    features = _validated(
        NEURONPEDIA_FEATURES, doc if isinstance(doc, list) else [doc], "Neuronpedia feature answer"
    )
    groups: dict[int, tuple[str, list, dict]] = {}
    for position, feature in enumerate(features):
        context = {"model_id": feature.modelId, "neuronpedia_layer": feature.layer}
        group = groups.setdefault(feature.index, (f"entry {position}", [], context))
        group[1].extend(
            (e.description, {"explainer": e.explanationModelName, "type": e.typeName})
            for e in feature.explanations
        )
    return _collected(groups, "neuronpedia_feature")


def read_mistudio(doc: Any) -> LabelDocument:
    """miStudio's explanations.json."""
    document = _validated(MISTUDIO, doc, "miStudio label export")
    groups: dict[int, tuple[str, list, dict]] = {}
    for position, feature in enumerate(document.explanations):
        group = groups.setdefault(feature.feature_index, (f"entry {position}", [], {}))
        group[1].extend(
            (e.description, {"method": e.method, "score": e.score, "created_at": e.created_at})
            for e in feature.explanations
        )
    return _collected(groups, "mistudio")


def read_plain(doc: Any) -> LabelDocument:
    """A plain {"<index>": label or {"label": ..., ...}} object; an object's other keys are kept
    as detail."""
    entries = _validated(PLAIN, doc, "labels object", plain=True)
    keys: dict[int, str] = {}
    for key in doc:
        index = int(key.strip())
        if index in keys:  # "5" and "05"
            raise refused(
                f"invalid labels object: entry {key!r}: index {index} appears twice (also as "
                f"{keys[index]!r})"
            )
        keys[index] = key
    labels, skipped = [], 0
    for index in sorted(entries):
        entry = entries[index]
        text = entry.label.strip()
        if not text:
            skipped += 1
            continue
        labels.append(Label(index, text, dict(entry.model_extra or {}), f"entry {keys[index]!r}"))
    return LabelDocument("json", labels, skipped)


def read_csv(text: str) -> LabelDocument:
    """`index,label` rows (a first row whose first cell is `index` is a header); labels with
    commas are quoted."""
    # an unclosed quote is an error, not a label to the end
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    labels: dict[int, Label] = {}
    skipped, first = 0, True
    try:
        for row in reader:
            where = f"row {reader.line_num}"
            cells = [cell.strip() for cell in row]
            if not any(cells):
                continue
            if first and cells[0].lower() == "index":
                first = False
                continue
            first = False
            if len(cells) < 2 or any(cells[2:]):
                raise refused(
                    f"invalid labels CSV: {where}: expected 2 cells (index,label), got "
                    f"{len(cells)}; quote a label that holds a comma"
                )
            if not DIGITS.fullmatch(cells[0]):
                raise refused(
                    f"invalid labels CSV: {where}: index {cells[0][:40]!r} is not a number"
                )
            index = int(cells[0])
            if index in labels:
                raise refused(
                    f"invalid labels CSV: {where}: index {index} appears twice (first in "
                    f"{labels[index].entry})"
                )
            if not cells[1]:
                skipped += 1
                continue
            labels[index] = Label(index, cells[1], {}, where)
    except csv.Error as exc:
        raise refused(f"invalid labels CSV: row {reader.line_num}: {exc}") from None
    return LabelDocument("csv", [labels[i] for i in sorted(labels)], skipped)


READERS = {
    "neuronpedia": read_neuronpedia,
    "neuronpedia_feature": read_neuronpedia_features,
    "mistudio": read_mistudio,
    "json": read_plain,
}


# ---- which format --------------------------------------------------------------------------------
def detect_format(doc: Any) -> str:
    """The JSON format of a parsed document, by its shape."""
    if isinstance(doc, list):
        first = doc[0] if doc else None
        return (
            "neuronpedia_feature"
            if isinstance(first, dict) and "explanations" in first
            else "neuronpedia"
        )
    if isinstance(doc, dict):
        if "explanations" in doc:
            return "neuronpedia_feature" if "index" in doc else "mistudio"
        return "json"
    kind = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(doc), "null"
    )
    raise refused(
        f"a labels document is a JSON object or list (or index,label CSV); this one is {kind}"
    )


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")  # a spreadsheet's CSV often starts with a byte-order mark
    except UnicodeDecodeError as exc:
        raise refused(
            f"the labels document is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None


def read_document(
    raw: bytes, content_type: str | None = None, forced: str | None = None
) -> LabelDocument:
    """A labels document from a request body: `forced` names the format; else text/csv is CSV, a
    body that parses as JSON is JSON (its format by its shape), and any other body is CSV unless
    it was sent as application/json."""
    text = _text(raw)
    media = (content_type or "").split(";")[0].strip().lower()
    if forced == "csv" or (forced is None and media in ("text/csv", "application/csv")):
        return read_csv(text)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        if forced is None and not media.endswith("json"):
            return read_csv(text)
        raise refused(f"the labels document is not valid JSON: {exc}") from None
    fmt = forced or detect_format(doc)
    return READERS[fmt](doc)


def check_width(document: LabelDocument, width: int) -> None:
    """Every index within the SAE's width, or 400 invalid_feature_index naming the first entry
    past it."""
    for label in document.labels:
        if label.index >= width:
            raise InvalidFeatureIndex(
                f"{label.entry or f'index {label.index}'}: feature {label.index} is past the "
                f"SAE's width ({width} features: 0..{width - 1})"
            )


# ---- the OpenAPI statement of what PUT/PATCH accept ----------------------------------------------
def _schema(adapter: TypeAdapter) -> dict:
    return adapter.json_schema(ref_template="#/components/schemas/{model}")


def document_schemas() -> dict[str, dict]:
    """JSON Schemas of the JSON formats (components), for the served OpenAPI schema."""
    schemas: dict[str, dict] = {}
    for name, adapter in (
        ("NeuronpediaExplanations", NEURONPEDIA),
        ("NeuronpediaFeatures", TypeAdapter(NeuronpediaFeature | list[NeuronpediaFeature])),
        ("MistudioLabels", MISTUDIO),
    ):
        schema = _schema(adapter)
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    index = {
        "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": "^[0-9]+$"}]
    }
    for model in ("NeuronpediaExplanation", "NeuronpediaFeature"):
        schemas[model]["properties"]["index"] = index
    schemas["MistudioFeature"]["properties"]["feature_index"] = index
    schemas["PlainLabels"] = {
        "type": "object",
        "description": 'A plain {"<index>": label} object; a value may be an object with a '
        '"label".',
        "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "required": ["label"],
                    "properties": {"label": {"type": "string"}},
                },
            ]
        },
    }
    return schemas
