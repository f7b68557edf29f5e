"""/api/saes/{id}/labels and /api/saes/{id}/features: feature labels (import, export, clear),
ranked label search, and one feature's details with its nearest features by decoder cosine."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from millm.formats.labels import ExportFormat, LabelFormat
from millm.kernel.runtime.jobs import JobView
from millm.lab.labels.labelling import Labelling
from millm.lab.labels.protocol import ExplainRequest, ExplanationView, LabelImport, TopTokenLabels
from millm.lab.labels.service import (
    FeatureDetail,
    FeatureManagement,
    FeatureSearch,
    LabelsCleared,
    SearchBy,
)
from millm.lab.steering.protocol import LabelSource
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute

router = APIRouter(route_class=JsonRoute)

FORMAT = Query(
    alias="format",
    description="Force the document's format; by default it is detected (text/csv or non-JSON: "
    "CSV).",
)
EXPORTS = {"json": "json", "csv": "csv", "neuronpedia": "json", "mistudio": "json"}
EXPORT_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The labels in the asked format",
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": "#/components/schemas/PlainLabels"},
                        {"$ref": "#/components/schemas/NeuronpediaExplanations"},
                        {"$ref": "#/components/schemas/MistudioLabels"},
                    ]
                }
            },
            "text/csv": {"schema": {"type": "string"}},
        },
    }
}


async def _import(request: Request, sae_id: str, fmt: str | None, replace: bool) -> LabelImport:
    raw = await request.body()  # capped by MAX_IMPORT_BYTES before it is read (body_limit.py)
    return await run_in_threadpool(
        part(request, FeatureManagement).import_labels,
        sae_id,
        raw,
        request.headers.get("content-type"),
        fmt,
        replace,
    )


@router.put(
    "/api/saes/{sae_id}/labels",
    summary="Replace an SAE's feature labels",
    response_model=LabelImport,
)
async def put_labels(
    sae_id: str, request: Request, fmt: Annotated[LabelFormat | None, FORMAT] = None
) -> LabelImport:
    """The document (Neuronpedia export or feature answer, miStudio explanations, {index: label}
    JSON, or index,label CSV) becomes the SAE's whole set of labels; refused whole (400) if any
    entry is bad."""
    return await _import(request, sae_id, fmt, replace=True)


@router.patch(
    "/api/saes/{sae_id}/labels",
    summary="Merge feature labels into an SAE's set",
    response_model=LabelImport,
)
async def patch_labels(
    sae_id: str, request: Request, fmt: Annotated[LabelFormat | None, FORMAT] = None
) -> LabelImport:
    """The document's labels replace those of the same features; the others stay."""
    return await _import(request, sae_id, fmt, replace=False)


@router.get(
    "/api/saes/{sae_id}/labels", summary="Export an SAE's feature labels", responses=EXPORT_RESPONSE
)
def get_labels(
    sae_id: str,
    request: Request,
    fmt: Annotated[ExportFormat, Query(alias="format")] = "json",
    detail: Annotated[
        bool,
        Query(
            description="json only: each value an object with the label and what its source said "
            "beside it"
        ),
    ] = False,
) -> Response:
    """json: {index: label}; csv: index,label; neuronpedia: the explanation export list; mistudio:
    its explanations.json. Each re-imports (PUT) to the same set."""
    media_type, body = part(request, FeatureManagement).export_labels(sae_id, fmt, detail)
    disposition = f'attachment; filename="{sae_id}-labels-{fmt}.{EXPORTS[fmt]}"'
    return Response(body, media_type=media_type, headers={"content-disposition": disposition})


@router.delete(
    "/api/saes/{sae_id}/labels",
    summary="Clear an SAE's feature labels",
    response_model=LabelsCleared,
)
def delete_labels(sae_id: str, request: Request) -> LabelsCleared:
    """Remove every label of the SAE (its own feature_labels.json is not imported again)."""
    return part(request, FeatureManagement).clear_labels(sae_id)


@router.get(
    "/api/saes/{sae_id}/features",
    summary="Search an SAE's features by label, ranked",
    response_model=FeatureSearch,
)
def search_features(
    sae_id: str,
    request: Request,
    q: Annotated[
        str,
        Query(
            max_length=1000,
            description="Free text; its words are matched (prefixes too) and ranked by BM25",
        ),
    ] = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    by: Annotated[
        SearchBy,
        Query(
            description="text: BM25 over the words; meaning: cosine of embeddings (the served "
            "model's, or MILLM_EMBEDDINGS_BASE_URL's); both: the two fused by reciprocal rank"
        ),
    ] = "text",
) -> FeatureSearch:
    """Labelled features ranked by relevance of their label, top tokens and example to `q` (score:
    larger is better), by words, meaning or both; an empty `q` lists every labelled feature by
    index."""
    return part(request, FeatureManagement).search_features(sae_id, q, limit, by)


@router.get(
    "/api/saes/{sae_id}/features/{index}",
    summary="One feature: label, decoder norm, nearest features",
    response_model=FeatureDetail,
)
async def feature_detail(
    sae_id: str, index: int, request: Request, k: Annotated[int, Query(ge=1, le=100)] = 10
) -> FeatureDetail:
    """The feature's label (with its source and detail), ||W_dec[index]||, and the `k` features
    whose decoder rows have the highest cosine with its own."""
    return await part(request, FeatureManagement).feature_detail(sae_id, index, k)


@router.post(
    "/api/saes/{sae_id}/labels/embeddings",
    summary="Embed an SAE's labels for search by meaning ahead of the first search (a job)",
    status_code=202,
    response_model=JobView,
    responses={202: {"description": "The job, started: follow it at GET /api/jobs/{id}"}},
)
def embed_labels(sae_id: str, request: Request) -> JSONResponse:
    """Each label's text (or its best explanation) embedded by the search's embedder, in
    batches, and kept until the labels change; a search by meaning meanwhile waits for them."""
    view = part(request, FeatureManagement).embed_labels(sae_id)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.post(
    "/api/saes/{sae_id}/labels/import",
    summary="Import labels from Neuronpedia, a URL or a file",
    response_model=LabelImport,
)
async def import_labels_from(sae_id: str, body: LabelSource, request: Request) -> LabelImport:
    """`source` is `neuronpedia` (every explanation Neuronpedia has for the SAE's Neuronpedia id),
    a URL, or a file inside the allowed directories; the document is imported as a PUT (or, with
    `replace` false, a PATCH) of it would be."""
    return await run_in_threadpool(
        part(request, FeatureManagement).import_labels_from, sae_id, body.source, body.replace
    )


@router.post(
    "/api/saes/{sae_id}/labels/top-tokens",
    summary="Label features by their calibration's top tokens",
    response_model=LabelImport,
)
async def label_top_tokens(sae_id: str, body: TopTokenLabels, request: Request) -> LabelImport:
    """Each feature that fired in the SAE's calibration on the served model is labelled by the
    tokens it fired hardest on ("pirate / ship / sea"), with its top tokens, best example,
    frequency and largest activation beside the label (source `top_tokens`)."""
    return await run_in_threadpool(part(request, Labelling).label_top_tokens, sae_id, body)


@router.post(
    "/api/saes/{sae_id}/labels/explain",
    summary="Explain and score features with a model (a job)",
    status_code=202,
    response_model=JobView,
    responses={202: {"description": "The job, started: follow it at GET /api/jobs/{id}"}},
)
def explain(sae_id: str, body: ExplainRequest, request: Request) -> JSONResponse:
    """Explain the named features of an attached, calibrated SAE from their calibration examples
    (delphi's prompts), score each explanation by detection, and store it beside the labels."""
    view = part(request, Labelling).explain(sae_id, body)
    return JSONResponse(view.model_dump(mode="json"), status_code=202)


@router.get(
    "/api/saes/{sae_id}/explanations",
    summary="Explanations a model wrote for an SAE's features",
    response_model=list[ExplanationView],
)
def explanations(sae_id: str, request: Request) -> list[ExplanationView]:
    """Every stored explanation, with its explainer, scorer, prompt version and detection score."""
    return part(request, Labelling).explanations(sae_id)
