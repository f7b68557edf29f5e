"""Feature labels and feature details, as the API presents them.

Imports, exports, clears and searches are store and SQLite work: the API calls them from plain
(worker-pool) route functions. A feature's details need the SAE's decoder: read once per SAE on a
passing thread (torch), then numpy on a worker thread (kernel/steering/decoders.py).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from anyio import to_thread
from pydantic import BaseModel

from millm.errors import InvalidRequest
from millm.formats.label_exports import export_csv, export_json, export_mistudio, export_neuronpedia
from millm.formats.labels import ExportFormat
from millm.interp.sae_files import SAEInfo
from millm.interp.steering import check_feature
from millm.kernel.books.calibrations import FeatureFigures
from millm.kernel.books.label_search import FeatureMatch, fts_query
from millm.kernel.books.label_sources import import_document, import_source
from millm.kernel.runtime.jobs import JobHandle, JobView
from millm.kernel.steering.decoders import Decoder, neighbours
from millm.lab.labels.labelling import calibrated_on
from millm.lab.labels.meaning import MeaningBook, embedder_for, fused
from millm.lab.labels.parts import LabelParts
from millm.lab.labels.protocol import ExplanationView, LabelImport
from millm.wording import counted


class LabelsCleared(BaseModel):
    """What DELETE /api/saes/{id}/labels removed."""

    sae_id: str
    deleted: int


class FeatureHit(FeatureMatch):
    """A search result with its calibration figures, when the SAE is calibrated on the model."""

    frequency: float | None = None  # fraction of read positions where it fires (its density)
    max_activation: float | None = None


SearchBy = Literal["text", "meaning", "both"]
FUSION_DEPTH = 100  # of each ranking, fused when searching by both


class FeatureSearch(BaseModel):
    """Labelled features ranked by relevance to `query` (all, by index, when it is empty)."""

    object: str = "list"
    sae_id: str
    query: str
    by: str = "text"  # text (BM25), meaning (cosine of embeddings) or both (reciprocal rank fusion)
    labels: int  # how many features of the SAE have a label
    has_labels: bool  # whether any has
    calibrated_on: str | None  # the model whose calibration gave the figures (null: none)
    data: list[FeatureHit]


class Neighbour(BaseModel):
    """A feature near another: its index, the cosine of their decoder rows, and its label."""

    index: int
    cosine: float
    label: str | None


class FeatureDetail(BaseModel):
    """One feature: its label (with source and detail), decoder norm and nearest features by
    decoder cosine."""

    object: str = "feature"
    sae_id: str
    index: int
    label: str | None
    source: str | None
    detail: dict[str, Any] | None
    decoder_norm: float
    neighbours: list[Neighbour]
    # the model whose calibration gave `calibration` (null: not calibrated)
    calibrated_on: str | None
    calibration: FeatureFigures | None  # frequency, mean, max, quantiles and top examples
    explanations: list[ExplanationView] = []  # what models wrote for it, beside its label


# labels -------------------------------------------------------------------------------------------


def _neuronpedia_ids(info: SAEInfo) -> tuple[str | None, str]:
    """(modelId, layer) for a Neuronpedia export: from the SAE's neuronpedia_id when it has one."""
    if info.neuronpedia_id and "/" in info.neuronpedia_id:
        model_id, layer = info.neuronpedia_id.split("/", 1)
        return model_id, layer
    return info.model_name, info.id


class FeatureManagement:
    """Feature labels and details as the API presents them."""

    def __init__(self, state: LabelParts, meanings: MeaningBook):
        self.state = state
        self.meanings = meanings  # label embeddings for search by meaning

    def import_labels(
        self, sae_id: str, raw: bytes, content_type: str | None, fmt: str | None, replace: bool
    ) -> LabelImport:
        """Read a labels document (any accepted format), check it against the SAE's width, and
        replace the SAE's set with it or merge it in; all or nothing."""
        info = self.state.saes.get(sae_id)
        document, counts = import_document(self.state.labels, info, raw, content_type, fmt, replace)
        return LabelImport.of(sae_id, document, counts)

    def import_labels_from(self, sae_id: str, source: str, replace: bool) -> LabelImport:
        """Import labels from `source`: 'neuronpedia' (the SAE's Neuronpedia export), a URL, or a
        file inside the allowed directories (blocking: fetches and reads)."""
        info = self.state.saes.get(sae_id)
        document, counts = import_source(
            self.state.labels,
            info,
            source,
            self.state.settings.neuronpedia_url,
            replace,
            confine=lambda path: self.state.registrations.paths.local(path, "source"),
        )
        return LabelImport.of(sae_id, document, counts)

    def export_labels(self, sae_id: str, fmt: ExportFormat, detail: bool) -> tuple[str, str]:
        """(media type, body) of the SAE's labels in `fmt`; each re-imports to the same set."""
        info = self.state.saes.get(sae_id)
        labels = self.state.labels.labels(sae_id)
        if fmt == "csv":
            return "text/csv; charset=utf-8", export_csv(labels)
        if fmt == "neuronpedia":
            model_id, layer = _neuronpedia_ids(info)
            return "application/json", json.dumps(export_neuronpedia(labels, model_id, layer))
        if fmt == "mistudio":
            return "application/json", json.dumps(export_mistudio(labels))
        return "application/json", json.dumps(export_json(labels, detail))

    def clear_labels(self, sae_id: str) -> LabelsCleared:
        """Remove every label of the SAE."""
        self.state.saes.get(sae_id)
        return LabelsCleared(sae_id=sae_id, deleted=self.state.labels.clear(sae_id))

    def embed_labels(self, sae_id: str) -> JobView:
        """Embed the SAE's label texts for search by meaning ahead of the first search, as a job
        (blocking: the store): its labels are its progress, in batches."""
        self.state.saes.get(sae_id)
        embedder = embedder_for(self.state)
        labels = self.state.labels
        version = labels.version(sae_id)  # before the rows, as a search reads them
        rows = labels.listed(sae_id)
        if not rows:
            raise InvalidRequest(
                f"SAE {sae_id} has no labels or explanations to embed", param="sae_id"
            )

        def work(handle: JobHandle) -> dict:
            def progress(done: int) -> None:
                handle.advance(done)
                handle.check()

            self.meanings.embedded(embedder, sae_id, version, rows, progress)
            return {"sae_id": sae_id, "embedder": embedder.name, "labels": len(rows)}

        return self.state.jobs.start(
            "embed labels",
            f"embed the {counted(len(rows), 'label')} of {sae_id} with {embedder.name}",
            len(rows),
            "labels",
            work,
        )

    def meaning_ready(self, sae_id: str) -> bool:
        """Whether a search by meaning of the SAE's labels would answer at once (its label
        embeddings made, by the embedding job or an earlier search)."""
        return self.meanings.made(
            embedder_for(self.state), sae_id, self.state.labels.version(sae_id)
        )

    def search_features(
        self, sae_id: str, query: str, limit: int, by: SearchBy = "text"
    ) -> FeatureSearch:
        """The SAE's labelled features ranked by relevance to `query`: by its words (BM25), by
        meaning (embeddings' cosine), or both fused by reciprocal rank (meaning.py)."""
        self.state.saes.get(sae_id)
        labels = self.state.labels
        if by == "text" or fts_query(query) is None:
            found = labels.search(sae_id, query, limit)
        else:
            depth = max(limit, FUSION_DEPTH)
            version = labels.version(sae_id)  # before the rows: a later write re-embeds them
            meaning = self.meanings.search(
                embedder_for(self.state), sae_id, version, labels.listed(sae_id), query, depth
            )
            found = (
                meaning[:limit]
                if by == "meaning"
                else fused(labels.search(sae_id, query, depth), meaning, limit)
            )
        total = self.state.labels.count(sae_id)
        model = calibrated_on(self.state, sae_id)
        figures = (
            self.state.calibrations.figures(sae_id, model, [hit.index for hit in found])
            if model is not None
            else {}
        )
        data = [
            FeatureHit(**hit.model_dump(), frequency=f.frequency, max_activation=f.max)
            if (f := figures.get(hit.index))
            else FeatureHit(**hit.model_dump())
            for hit in found
        ]
        return FeatureSearch(
            sae_id=sae_id,
            query=query,
            by=by,
            labels=total,
            has_labels=total > 0,
            calibrated_on=model,
            data=data,
        )

    # feature details ------------------------------------------------------------------------------
    def _detail(self, sae_id: str, index: int, k: int, decoder: Decoder) -> FeatureDetail:
        entries = self.state.labels.entries(sae_id)
        entry = dict(entries.get(index) or {})
        label, source = entry.pop("label", None), entry.pop("source", None)
        near = [
            Neighbour(index=i, cosine=c, label=(entries.get(i) or {}).get("label"))
            for i, c in neighbours(decoder, index, k)
        ]
        model = calibrated_on(self.state, sae_id)
        figures = (
            self.state.calibrations.figures(sae_id, model, [index]).get(index)
            if model is not None
            else None
        )
        return FeatureDetail(
            sae_id=sae_id,
            index=index,
            label=label,
            source=source,
            detail=entry if label is not None else None,
            decoder_norm=float(decoder.norms[index]),
            neighbours=near,
            calibrated_on=model,
            calibration=figures,
            explanations=[
                ExplanationView.of(row)
                for row in self.state.labels.explanations(sae_id)
                if row.feature == index
            ],
        )

    async def neighbours(self, sae_id: str, indices: list[int], k: int) -> list[tuple[int, float]]:
        """The k features nearest a group of features by decoder cosine (its centroid's), with
        the cosines."""
        decoder = await self.state.decoders.of(sae_id)
        return await to_thread.run_sync(neighbours, decoder, indices, k)

    async def feature_detail(self, sae_id: str, index: int, k: int) -> FeatureDetail:
        """A feature's label, decoder norm, its k nearest features by decoder cosine, and its
        calibration figures when known."""
        info = self.state.saes.get(sae_id)
        check_feature(info, index, param="index")
        decoder = await self.state.decoders.of(sae_id)
        return await to_thread.run_sync(self._detail, sae_id, index, k, decoder)
