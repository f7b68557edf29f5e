"""A conversation as the served model's chat template renders it (the tokens chat/tokenize lists
and compute-logit-attribution's index counts), and a prefix of those tokens as the text that
encodes back to them."""

from __future__ import annotations

from millm.engine.loader import LoadedModel
from millm.engine.prompts import completion_prompt_ids
from millm.errors import InvalidRequest, ModelNotLoaded
from millm.lab.discovery.inputs import conversation_prompt
from millm.lab.discovery.protocol import DiscoveryMessage
from millm.lab.ember.features import served_model
from millm.lab.ember.parts import EmberParts
from millm.lab.ember.protocol import Message


def rendered(
    state: EmberParts, messages: list[Message], model: str
) -> tuple[LoadedModel, list[int]]:
    """The served model and the conversation's token ids as /v1/chat/completions renders it
    (blocking: the template)."""
    served_model(state, model)
    lm = state.switch.lm
    if lm is None:
        raise ModelNotLoaded("no model is loaded to render the conversation with")
    try:
        conversation = [DiscoveryMessage.model_validate(m) for m in messages]
    except ValueError as exc:  # pydantic's, said as a 400 naming the field
        raise InvalidRequest(f"messages: {exc}", param="messages") from None
    return lm, conversation_prompt(lm, conversation, "messages")


def prefix_text(lm: LoadedModel, ids: list[int]) -> str:
    """Token ids as the text a completion prompt encodes back to them (the tokenizer's own
    special tokens, which encoding adds, left out); a 400 when no text does (blocking)."""
    added = completion_prompt_ids(lm.tokenizer, "", True)
    body = ids[len(added) :] if added and ids[: len(added)] == added else ids
    text = str(
        lm.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    )
    if completion_prompt_ids(lm.tokenizer, text, True) != ids:
        raise InvalidRequest(
            "the tokens before startIndex do not encode back to themselves as text, so no graph "
            "can be traced from them here; POST /api/attribution takes the conversation itself",
            param="startIndex",
        )
    return text
