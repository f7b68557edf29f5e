"""Fields a request path does not use: named in X-miLLM-Ignored-Fields, or refused in strict mode.

A location is how the field sits in the body: "foo", "messages[2].name",
"extra_messages[0][1].weight". Unknown keys are found at every nesting level of the parsed body
(the request models keep them); known fields that this path does not read are named by the
rules below. Neutral values and explicit nulls mean "no change" and are not reported.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from pydantic import BaseModel

from millm.engine.prompts import template_source
from millm.errors import UnusedFieldsRefused
from millm.protocol.field_policy import is_neutral

log = logging.getLogger("millm.requests")

# Message keys a chat template may or may not read; reported when the model's template does not.
TEMPLATE_KEYS = ("name", "tool_call_id", "tool_calls")
# Sampling fields scoring does not apply (temperature does: it divides the logits).
NOT_IN_SCORING = ("top_p", "stop", "frequency_penalty", "presence_penalty")
PRINTABLE_ASCII = "".join(chr(c) for c in range(0x20, 0x7F))


def percent_encode(name: str) -> str:
    """A field location with every character outside printable ASCII percent-encoded (UTF-8)."""
    return quote(name, safe=PRINTABLE_ASCII)


def template_reads(tokenizer) -> set[str]:
    """Which optional message keys the model's chat template mentions (none for the generic fallback)."""
    source = template_source(tokenizer)
    return {
        key
        for key in TEMPLATE_KEYS
        if re.search(rf"""(\.{key}\b|\[\s*['"]{key}['"]\s*\])""", source)
    }


def template_kwargs_unused(kwargs: dict | None, variables: frozenset[str] | None) -> list[str]:
    """chat_template_kwargs keys the template will not read: all of them when the engine renders
    no variables (`variables` None: llama.cpp), else those the template never mentions."""
    if not kwargs:
        return []
    if variables is None:
        return ["chat_template_kwargs"]
    return [
        percent_encode(f"chat_template_kwargs.{key}") for key in kwargs if key not in variables
    ]  # a key may hold anything


def _extras(node, path: str) -> list[str]:
    """Unknown keys at every level of a parsed body."""
    found: list[str] = []
    if isinstance(node, BaseModel):
        for key, value in (node.model_extra or {}).items():
            if not is_neutral(key, value):  # null and "no change" values drop nothing
                found.append(f"{path}.{key}" if path else key)
        for name in type(node).model_fields:
            child = getattr(node, name)
            found += _extras(child, f"{path}.{name}" if path else name)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found += _extras(item, f"{path}[{i}]")
    return found


def _message_keys(conversations: list[tuple[str, list]], reads: set[str]) -> list[str]:
    found = []
    for prefix, messages in conversations:
        for i, message in enumerate(messages):
            for key in TEMPLATE_KEYS:
                if getattr(message, key, None) is not None and key not in reads:
                    found.append(f"{prefix}[{i}].{key}")
    return found


def unused_locations(
    body: BaseModel, *, scoring: bool = False, reads: set[str] | None = None
) -> list[str]:
    """Every location in `body` the request path will not use, in body order."""
    fields = body.model_dump(exclude_unset=True)
    found = _extras(body, "")
    if fields.get("user") is not None:
        found.append("user")
    if fields.get("stream_options") is not None and not fields.get("stream"):
        found.append("stream_options")
    if scoring:
        found += [key for key in NOT_IN_SCORING if fields.get(key) is not None]
    elif fields.get("return_tokens_as_token_ids") is not None:
        found.append("return_tokens_as_token_ids")
    schema_format = getattr(
        getattr(body, "response_format", None), "json_schema", None
    )  # a dict where not declared
    if getattr(schema_format, "description", None) is not None:
        found.append(
            "response_format.json_schema.description"
        )  # OpenAI shows it to its model; millm does not
    if hasattr(body, "messages"):
        conversations = [("messages", body.messages)]
        conversations += [
            (f"extra_messages[{c}]", msgs)
            for c, msgs in enumerate(getattr(body, "extra_messages", None) or [])
        ]
        found += _message_keys(conversations, reads or set())
    return [percent_encode(loc) for loc in dict.fromkeys(found)]


def as_is(location: str) -> str | None:
    """A location in a body the client sent as it is."""
    return location


@dataclass(frozen=True)
class SentAs:
    """How a request another endpoint translated was sent (/v1/responses said as a chat request):
    the locations its own body ignores, and where a chat location came from (None: not from this
    request, e.g. an earlier turn of previous_response_id, so not reported again)."""

    ignored: tuple[str, ...] = ()
    locate: Callable[[str], str | None] = as_is

    def merge(self, locations: list[str]) -> list[str]:
        """The sender's own ignored locations, then `locations` in the sender's words."""
        located = [self.locate(location) for location in locations]
        return list(
            dict.fromkeys([*self.ignored, *(where for where in located if where is not None)])
        )


AS_SENT = SentAs()


def handle_unused(locations: list[str], strict: bool) -> tuple[str, ...]:
    """Strict: 400 naming every location. Otherwise one log warning; the locations come back
    for the response's X-miLLM-Ignored-Fields header."""
    if not locations:
        return ()
    if strict:
        raise UnusedFieldsRefused(
            f"X-miLLM-Strict is set and these fields would be ignored: {', '.join(locations)}",
            param=locations[0],
        )
    log.warning("request_fields_unused %s", json.dumps(locations))
    return tuple(locations)
