"""Goodfire Ember's routes (`/api/inference/v1/...`), as the `goodfire` SDK 0.3.5 calls them.

Every route reads the model and changes nothing stored: the API key opens them, as it opens /v1.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request

from millm.lab.ember.catalogue import EmberFeatures
from millm.lab.ember.protocol import (
    AttributionAnswer,
    AttributionBody,
    AutoEdits,
    ChatAnswer,
    ContrastAnswer,
    ContrastBody,
    DatasetBody,
    EmberChatRequest,
    FeatureList,
    FeaturesAnswer,
    FeaturesBody,
    LogitsAnswer,
    LogitsBody,
    LookupBody,
    LookupList,
    NeighborList,
    NeighborsBody,
    RerankBody,
    SpecificationBody,
    TokenizeBody,
    TokenList,
)
from millm.lab.ember.service import Ember
from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute
from millm.v1.serving.http_replies import frames, respond, unless_client_leaves
from millm.v1.serving.routes import ignored_cap, strict

PREFIX = "/api/inference/v1"
router = APIRouter(route_class=JsonRoute)


# No [DONE]: the SDK splits what it reads on "data: " and parses every piece, so a [DONE] read
# together with a chunk would be parsed as one; the stream's end says it is done.
ember_frames = partial(frames, done=False)


@router.post(
    f"{PREFIX}/chat/completions",
    summary="Ember: a chat answer from a model or a variant (its controller as steering)",
    response_model=ChatAnswer,
)
async def chat_completions(body: EmberChatRequest, request: Request):
    """A chat completion, streamed or not, as the goodfire SDK reads it."""
    reply = await unless_client_leaves(request, part(request, Ember).chat(body, strict(request)))
    return respond(reply, ignored_cap(request), framing=ember_frames)


@router.get(f"{PREFIX}/features/search", summary="Ember: features whose labels match a query")
def search(
    request: Request,
    query: str,
    model: str,
    page: int = 1,
    per_page: Annotated[int, Query(alias="perPage")] = 10,
) -> FeatureList:
    """The label search's best features for the query."""
    return part(request, EmberFeatures).search(query, page, per_page, model)


@router.post(f"{PREFIX}/features/rerank", summary="Ember: features re-ranked by a query")
def rerank(body: RerankBody, request: Request) -> FeatureList:
    """The given features in the label search's order for the query."""
    return part(request, EmberFeatures).rerank(body)


@router.post(f"{PREFIX}/features/lookup", summary="Ember: features by index")
def lookup(body: LookupBody, request: Request) -> LookupList:
    """Features of the attached SAE by index, with their labels."""
    return part(request, EmberFeatures).lookup(body)


@router.get(f"{PREFIX}/features/", summary="Ember: features by id")
def listed(request: Request, feature_id: Annotated[list[str], Query(min_length=1)]) -> FeatureList:
    """Features by their ids, with their labels."""
    return part(request, EmberFeatures).listed(feature_id)


@router.post(f"{PREFIX}/attributions/neighbors", summary="Ember: a feature's nearest features")
async def neighbors(body: NeighborsBody, request: Request) -> NeighborList:
    """The features whose decoder rows are nearest the given ones'."""
    return await part(request, EmberFeatures).neighbors(body)


@router.post(
    f"{PREFIX}/chat-attribution/compute-features",
    summary="Ember: the features active at every token of a conversation",
)
async def compute_features(body: FeaturesBody, request: Request) -> FeaturesAnswer:
    """Each token with the features active there, in Ember's units."""
    return await unless_client_leaves(request, part(request, Ember).compute_features(body))


@router.post(f"{PREFIX}/chat/tokenize", summary="Ember: a conversation's tokens")
def tokenize(body: TokenizeBody, request: Request) -> TokenList:
    """The rendered conversation's tokens."""
    return part(request, Ember).tokenize(body)


@router.post(
    f"{PREFIX}/chat-attribution/compute-logits", summary="Ember: the next token's top logits"
)
async def compute_logits(body: LogitsBody, request: Request) -> LogitsAnswer:
    """The next token's top_k log-probabilities under the model or variant."""
    return await unless_client_leaves(request, part(request, Ember).logits(body))


@router.post(
    f"{PREFIX}/chat-attribution/contrast",
    summary="Ember: the features that separate two sets of conversations",
)
async def contrast(body: ContrastBody, request: Request) -> ContrastAnswer:
    """millm's contrast over the two sets."""
    return await unless_client_leaves(request, part(request, Ember).contrast(body))


@router.post(f"{PREFIX}/features/auto-edits", summary="Ember: AutoSteer's edits for a goal")
async def auto_edits(body: SpecificationBody, request: Request) -> AutoEdits:
    """AutoSteer's best setting for the goal, waited for (GET /api/jobs/{job} has the evidence)."""
    return await unless_client_leaves(request, part(request, Ember).auto_edits(body))


@router.post(f"{PREFIX}/features/auto-conditional", summary="Ember: a condition for a goal")
def auto_conditional(body: SpecificationBody, request: Request) -> dict:
    """The label search's best feature for the goal, above its median firing level."""
    return part(request, EmberFeatures).auto_conditional(body)


@router.post(
    f"{PREFIX}/attributions/compute-logit-attribution",
    summary="Ember: the features that drive one token of a conversation",
)
async def compute_logit_attribution(body: AttributionBody, request: Request) -> AttributionAnswer:
    """An attribution graph's features for the token at startIndex, by their effect on it."""
    return await unless_client_leaves(request, part(request, Ember).attribute(body))


@router.post(
    f"{PREFIX}/attributions/generate-contrastive-dataset",
    summary="Ember: not served (millm writes no datasets)",
)
def generate_contrastive_dataset(body: DatasetBody, request: Request) -> dict:
    """Refused: give contrast() conversations of your own."""
    return part(request, Ember).dataset(body)
