"""Ember's feature routes over the SAE's labels and decoder: search and rerank (the label search,
its ranking kept), lookup and listing by index or id, neighbours by decoder cosine, and
AutoConditional (the label search's best feature at its median firing level)."""

from __future__ import annotations

from anyio import to_thread

from millm.errors import InvalidRequest
from millm.interp.steering import Attached
from millm.lab.autosteer.inputs import search_words
from millm.lab.ember.features import (
    attached_sae,
    check_index,
    feature_id,
    feature_of,
    feature_out,
    labels_of,
    served_model,
    units_of,
)
from millm.lab.ember.parts import EmberParts
from millm.lab.ember.protocol import (
    FeatureList,
    FeatureOut,
    LookupBody,
    LookupFeature,
    LookupList,
    NeighborList,
    NeighborsBody,
    RerankBody,
    SpecificationBody,
)
from millm.lab.labels.service import FeatureManagement, SearchBy


def search_by(features: FeatureManagement, sae: Attached) -> SearchBy:
    """Ember searched by meaning: words and meaning fused once the SAE's label embeddings are made,
    words alone until then (making them takes minutes on a CPU, past the SDK's wait)."""
    return "both" if features.meaning_ready(sae.info.id) else "text"


class EmberFeatures:
    """Ember's feature routes over millm's labels and decoders."""

    def __init__(self, state: EmberParts, features: FeatureManagement):
        self.state, self.features = state, features

    def search(self, query: str, page: int, per_page: int, model: str) -> FeatureList:
        """The label search's ranking, a page of it (blocking: the labels' index)."""
        served_model(self.state, model)
        if page < 1 or not 1 <= per_page <= 1000:
            raise InvalidRequest("page counts from 1, and perPage is 1 to 1000", param="perPage")
        sae = attached_sae(self.state, None, "model")
        found = self.features.search_features(
            sae.info.id, query, page * per_page, search_by(self.features, sae)
        )
        return FeatureList(
            features=[
                FeatureOut(
                    id=feature_id(sae.info.id, hit.index),
                    label=hit.label,
                    index_in_sae=hit.index,
                    relevance=hit.score if hit.score is not None else 0.0,
                )
                for hit in found.data[(page - 1) * per_page :]
            ]
        )

    def rerank(self, body: RerankBody) -> FeatureList:
        """The given features in the label search's order for `query` (those it does not find
        after, as given), the first top_k (blocking)."""
        served_model(self.state, body.model)
        wanted = [feature_of(text, f"feature_ids[{n}]") for n, text in enumerate(body.feature_ids)]
        saes = {sae_id for sae_id, _ in wanted}
        if len(saes) > 1:
            raise InvalidRequest("feature_ids name features of several SAEs", param="feature_ids")
        if not wanted:
            return FeatureList(features=[])
        sae = attached_sae(self.state, saes.pop(), "feature_ids")
        labels = labels_of(self.state, sae.info.id)
        ranked = self.features.search_features(
            sae.info.id, body.query, sae.info.d_sae, search_by(self.features, sae)
        ).data
        score = {hit.index: hit.score or 0.0 for hit in ranked}
        order = {hit.index: rank for rank, hit in enumerate(ranked)}
        indices = list(dict.fromkeys(index for _, index in wanted))
        indices.sort(key=lambda i: order.get(i, len(order)))
        return FeatureList(
            features=[
                feature_out(sae.info.id, i, labels, score.get(i, 0.0))
                for i in indices[: body.top_k]
            ]
        )

    def lookup(self, body: LookupBody) -> LookupList:
        """Features by index, with their labels (blocking)."""
        served_model(self.state, body.model)
        sae = attached_sae(self.state, None, "model")
        labels = labels_of(self.state, sae.info.id)
        return LookupList(
            features=[
                LookupFeature(
                    uuid=feature_id(sae.info.id, index),
                    label=labels.get(index, ""),
                    index_in_sae=check_index(sae, index, f"indices[{n}]"),
                )
                for n, index in enumerate(body.indices)
            ]
        )

    def listed(self, ids: list[str]) -> FeatureList:
        """Features by id (blocking)."""
        found = []
        labels: dict[str, dict[int, str]] = {}
        for n, text in enumerate(ids):
            sae_id, index = feature_of(text, f"feature_id[{n}]")
            sae = attached_sae(self.state, sae_id, f"feature_id[{n}]")
            check_index(sae, index, f"feature_id[{n}]")
            if sae_id not in labels:
                labels[sae_id] = labels_of(self.state, sae_id)
            found.append(feature_out(sae_id, index, labels[sae_id]))
        return FeatureList(features=found)

    async def neighbors(self, body: NeighborsBody) -> NeighborList:
        """The features whose decoder rows are nearest the given ones' (their centroid's)."""
        served_model(self.state, body.model)
        sae = attached_sae(self.state, None, "model")
        indices = [
            check_index(sae, i, f"feature_indices[{n}]") for n, i in enumerate(body.feature_indices)
        ]
        if not 1 <= body.top_k <= 100:
            raise InvalidRequest("top_k is 1 to 100", param="top_k")
        detail = await self.features.neighbours(sae.info.id, indices, body.top_k)
        labels = await to_thread.run_sync(labels_of, self.state, sae.info.id)
        return NeighborList(neighbors=[feature_out(sae.info.id, i, labels) for i, _ in detail])

    def auto_conditional(self, body: SpecificationBody) -> dict:
        """A condition for the goal: the label search's best feature (the goal's instruction words
        left out, as AutoSteer searches) above its median firing level (blocking)."""
        served_model(self.state, body.model)
        sae = attached_sae(self.state, None, "model")
        units = units_of(self.state, sae, "model")
        words = search_words(body.specification)
        found = self.features.search_features(sae.info.id, words, 1).data
        if not found:
            raise InvalidRequest(
                f"no labelled feature of {sae.info.id} matches {body.specification!r}",
                param="specification",
                code="feature_not_found",
            )
        index = found[0].index
        typical = units.typical(index)
        level = typical if typical is not None else 0.5  # never fired: half of the SAE's scale
        feature = {
            "uuid": feature_id(sae.info.id, index),
            "label": found[0].label,
            "index_in_sae": index,
        }
        return {
            "conditional": {
                "conditionals": [
                    {"left_hand": {"features": [feature]}, "right_hand": level, "operator": ">"}
                ],
                "operator": "AND",
            }
        }
