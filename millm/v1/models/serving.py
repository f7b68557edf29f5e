"""/v1/models: the models a client can name, in OpenAI's shape (served models and steered
variants)."""

from __future__ import annotations

from millm.errors import ModelNotFound
from millm.kernel.model.registry import AVAILABLE
from millm.kernel.model.transitions import ModelView
from millm.v1.models.parts import ListingParts
from millm.v1.objects import ModelCard, ModelList


def model_card(view: ModelView) -> ModelCard:
    """OpenAI's model object, plus vLLM's max_model_len while the model is loaded."""
    return ModelCard(
        id=view.entry.name,
        created=int(view.entry.registered_at),
        owned_by=view.entry.owned_by,
        max_model_len=view.lm.context_length if view.lm is not None else None,
    )


def variant_card(row: dict, base: ModelCard) -> ModelCard:
    """A steered variant as a model: its base's card under its name, with the base as `parent`
    and its steering."""
    document = row["document"]
    steering = {
        key: document[key]
        for key in ("profile", "steering", "steering_intensity", "scoring", "description")
        if document.get(key) is not None
    }
    return ModelCard(
        id=row["name"],
        created=int(row["created_at"]),
        owned_by=base.owned_by,
        max_model_len=base.max_model_len,
        parent=base.id,
        millm={"variant": row["id"], **steering},
    )


class ModelListing:
    """The /v1/models routes' one way in."""

    def __init__(self, state: ListingParts):
        self.state = state

    def listed(self) -> ModelList:
        """Registered models that are available (ready, loading, loaded, unloading); under a
        steering lock only the locked model, so a steered server presents one stable id. A model
        whose load failed is not available."""
        views = [view for view in self.state.switch.views() if view.state in AVAILABLE]
        locked = self.state.switch.locked
        if locked is not None:
            views = [view for view in views if view.entry.name == locked]
        cards = {view.entry.name: model_card(view) for view in views}
        variants = [
            variant_card(row, cards[row["base"]])
            for row in self.state.variants.book.all()
            if row["base"] in cards
        ]
        return ModelList(data=[*cards.values(), *variants])

    def card(self, model_id: str) -> ModelCard:
        """One listed model's card; 404 model_not_found for a name that is not listed."""
        for card in self.listed().data:
            if card.id == model_id:
                return card
        raise ModelNotFound(f"The model {model_id!r} does not exist on this server", param="model")
