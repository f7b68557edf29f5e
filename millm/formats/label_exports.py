"""Feature labels written out in each format they are read in (json, csv, Neuronpedia, miStudio):
each export re-imports to the same set."""

from __future__ import annotations

import csv
import io
from typing import Any

from millm.formats.labels import Label


# ---- export --------------------------------------------------------------------------------------
def export_json(labels: list[Label], detail: bool = False) -> dict[str, Any]:
    """{"<index>": label}, or with `detail` {"<index>": {"label": ..., <detail>}} (both read back
    as `json`)."""
    return {str(x.index): ({"label": x.label, **x.detail} if detail else x.label) for x in labels}


def export_csv(labels: list[Label]) -> str:
    """`index,label` with a header row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["index", "label"])
    writer.writerows([x.index, x.label] for x in labels)
    return out.getvalue()


def export_neuronpedia(
    labels: list[Label], model_id: str | None, layer: str | None
) -> list[dict[str, Any]]:
    """Neuronpedia's export list: one explanation per feature (the label), with its explainer
    when known."""
    return [
        {
            "modelId": x.detail.get("model_id", model_id),
            "layer": x.detail.get("neuronpedia_layer", layer),
            "index": str(x.index),
            "description": x.label,
            "explanationModelName": x.detail.get("explainer"),
            "typeName": x.detail.get("type"),
        }
        for x in labels
    ]


def export_mistudio(labels: list[Label]) -> dict[str, Any]:
    """miStudio's explanations.json shape: one explanation per feature."""
    return {
        "explanations": [
            {
                "feature_index": x.index,
                "explanations": [
                    {
                        "description": x.label,
                        "method": x.detail.get("method"),
                        "score": x.detail.get("score"),
                    }
                ],
            }
            for x in labels
        ]
    }
