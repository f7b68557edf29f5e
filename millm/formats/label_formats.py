"""The label documents each source writes (Neuronpedia's explanations and features, miStudio's
export, a plain JSON map) as lenient pydantic models: unknown keys are kept, and a feature's
index may come as an integer or its decimal string."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, TypeAdapter
from pydantic_core import PydanticCustomError

DIGITS = re.compile(r"[0-9]+")


# ---- field types --------------------------------------------------------------------------------
def _index(value: Any) -> int:
    """A feature index: a whole number >= 0, or a string of digits (Neuronpedia writes them so)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and DIGITS.fullmatch(value.strip()):
        return int(value.strip())
    shown = (
        json.dumps(value) if isinstance(value, (int, float, bool)) or value is None else repr(value)
    )
    raise PydanticCustomError(
        "feature_index", "index {value} is not a number", {"value": shown[:40]}
    )


def _label_value(value: Any) -> Any:
    """A plain document's value: a label, or an object with one."""
    if isinstance(value, str):
        return {"label": value}
    if isinstance(value, dict):
        return value
    raise PydanticCustomError(
        "label_value", "the value must be a label (a string) or an object with a string 'label'", {}
    )


Index = Annotated[int, BeforeValidator(_index)]


class Loose(BaseModel):
    """A document's object: the keys millm reads are typed, any others pass (and are kept where
    said)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class NeuronpediaExplanation(Loose):
    """One explanation of Neuronpedia's export list."""

    index: Index
    description: str | None = None
    explanationModelName: str | None = None
    typeName: str | None = None
    modelId: str | None = None
    layer: str | int | None = None


class NeuronpediaFeatureExplanation(Loose):
    """An explanation inside Neuronpedia's per-feature answer."""

    description: str | None = None
    explanationModelName: str | None = None
    typeName: str | None = None


class NeuronpediaFeature(Loose):
    """Neuronpedia's per-feature answer: the feature and its explanations."""

    index: Index
    explanations: list[NeuronpediaFeatureExplanation] = []
    modelId: str | None = None
    layer: str | int | None = None


class MistudioExplanation(Loose):
    """One explanation of a feature in miStudio's explanations.json."""

    description: str | None = None
    method: str | None = None
    score: float | None = None
    created_at: str | None = None


class MistudioFeature(Loose):
    """A feature of miStudio's explanations.json."""

    feature_index: Index
    explanations: list[MistudioExplanation] = []


class MistudioLabels(Loose):
    """miStudio's explanations.json (explanations/ in its Neuronpedia export package)."""

    explanations: list[MistudioFeature]


class PlainEntry(Loose):
    """A plain document's value as an object: the label and whatever else the file says (kept as
    detail)."""

    label: str


NEURONPEDIA = TypeAdapter(list[NeuronpediaExplanation])
NEURONPEDIA_FEATURES = TypeAdapter(list[NeuronpediaFeature])
MISTUDIO = TypeAdapter(MistudioLabels)
PLAIN = TypeAdapter(dict[Index, Annotated[PlainEntry, BeforeValidator(_label_value)]])
