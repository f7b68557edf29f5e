"""Request validation, the API page's section of that name: every field is honoured, reported
or refused, never dropped silently.

Refused: the field_not_honoured matrix. One table (MATRIX) drives both the check and its tests; it
is the API page's table, column by column, plus a few OpenAI fields the page does not list but that
would change the output (functions, echo, best_of, suffix, audio, modalities). A field is refused
only when its value would change something: null and the neutral values (n: 1, logprobs: false,
response_format {"type": "text"}, tools: [], logit_bias: {}, modalities: ["text"]) pass everywhere.
The request models run the check while parsing (v1/serving/protocol.py), before the requested model
is looked at, let alone loaded.

Reported: fields a request path does not use are named in X-miLLM-Ignored-Fields, or refused in
strict mode. A location is how the field sits in the body: "foo", "messages[2].name",
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
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from millm.engine.loader import LoadedModel
from millm.engine.prompts import template_source
from millm.errors import FieldNotHonoured, UnusedFieldsRefused
from millm.v1.policy.schema_rules import at_most, equals, one_of_values, when

CHAT = "chat"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS)

HONOURED = "honoured"
REFUSED = "refused"
ABOVE_ONE = "refused above 1"
NOT_STREAMING = "honoured, not streaming"
NOT_ON_SCORING = "honoured, refused on scoring requests"


@dataclass(frozen=True)
class Rule:
    """A cell of the matrix: the verdict, and for refusals the reason told to the client."""

    verdict: str
    why: str = ""


OK = Rule(HONOURED)


def no(why: str) -> Rule:
    """A refusal with its reason."""
    return Rule(REFUSED, why)


MATRIX: dict[str, dict[str, Rule]] = {
    "logprobs": {CHAT: OK, COMPLETIONS: OK, EMBEDDINGS: no("embeddings score no tokens")},
    "allowed_token_ids": {CHAT: OK, COMPLETIONS: OK, EMBEDDINGS: no("embeddings score no tokens")},
    "top_logprobs": {
        CHAT: OK,
        COMPLETIONS: no("text completions take logprobs (the number of alternatives)"),
        EMBEDDINGS: no("embeddings score no tokens"),
    },
    "response_format": {
        CHAT: OK,
        COMPLETIONS: no("structured output applies to chat completions only"),
        EMBEDDINGS: no("embeddings produce no text to format"),
    },
    "seed": {
        CHAT: OK,
        COMPLETIONS: OK,
        EMBEDDINGS: no("embeddings are deterministic; there is nothing to seed"),
    },
    "n": {
        CHAT: Rule(NOT_STREAMING, "n > 1 cannot be streamed"),
        COMPLETIONS: Rule(ABOVE_ONE, "text completions give one choice per prompt"),
        EMBEDDINGS: Rule(ABOVE_ONE, "an input has one embedding"),
    },
    "max_completion_tokens": {
        CHAT: OK,
        COMPLETIONS: OK,
        EMBEDDINGS: no("embeddings generate no tokens"),
    },
    # Beyond the page's table: text completions take them too, as the original miLLM's do now.
    "profile": {
        CHAT: Rule(NOT_ON_SCORING, "scoring is never steered"),
        COMPLETIONS: Rule(NOT_ON_SCORING, "scoring is never steered"),
        EMBEDDINGS: no("embeddings are never steered"),
    },
    "steering_intensity": {
        CHAT: Rule(NOT_ON_SCORING, "scoring is never steered"),
        COMPLETIONS: Rule(NOT_ON_SCORING, "scoring is never steered"),
        EMBEDDINGS: no("embeddings are never steered"),
    },
    "return_sae_activations": {
        CHAT: OK,
        COMPLETIONS: OK,
        EMBEDDINGS: no("embeddings are never read through an SAE"),
    },
    # Beyond the page's table (issue 16): the spec says probes record nothing on scoring requests.
    "probes": {
        CHAT: Rule(NOT_ON_SCORING, "scoring is never probed"),
        COMPLETIONS: Rule(NOT_ON_SCORING, "scoring is never probed"),
        EMBEDDINGS: no("embeddings are never probed"),
    },
    "steering": {
        CHAT: Rule(NOT_ON_SCORING, "scoring is never steered"),
        COMPLETIONS: Rule(NOT_ON_SCORING, "scoring is never steered"),
        EMBEDDINGS: no("embeddings are never steered"),
    },
    # A vector cut short keeps its meaning only for models trained for it (Matryoshka embeddings).
    "dimensions": {e: no("no model here is trained for shortened embeddings") for e in ENDPOINTS},
    # Beyond the page's table (issue 9): real clients always send tools, so chat honours them.
    "tools": {
        CHAT: Rule(
            NOT_ON_SCORING, "scoring reads one next-token distribution; there is no call to make"
        ),
        COMPLETIONS: no("tool calling applies to chat completions"),
        EMBEDDINGS: no("embeddings call no tools"),
    },
    "tool_choice": {
        CHAT: Rule(
            NOT_ON_SCORING, "scoring reads one next-token distribution; there is no call to make"
        ),
        COMPLETIONS: no("tool calling applies to chat completions"),
        EMBEDDINGS: no("embeddings call no tools"),
    },
    "parallel_tool_calls": {
        CHAT: OK,
        COMPLETIONS: no("tool calling applies to chat completions"),
        EMBEDDINGS: no("embeddings call no tools"),
    },
    "logit_bias": {e: no("logit_bias is not supported") for e in ENDPOINTS},
    # Beyond the page's table: OpenAI's audio output, which would change what comes back.
    "audio": {e: no("millm generates text only; it has no audio output") for e in ENDPOINTS},
    "modalities": {e: no('millm generates text only: send ["text"]') for e in ENDPOINTS},
    # Beyond the page's table: legacy fields that would change the output.
    "functions": {
        CHAT: no("the legacy functions field is not supported; send tools"),
        COMPLETIONS: OK,
        EMBEDDINGS: OK,
    },
    "function_call": {
        CHAT: no("the legacy function_call field is not supported; send tool_choice"),
        COMPLETIONS: OK,
        EMBEDDINGS: OK,
    },
    # Beyond the page (issue 34): echo scores the prompt's own tokens, as lm-evaluation-harness
    # asks.
    "echo": {
        CHAT: no("chat completions do not echo; send the text to /v1/completions with echo: true"),
        COMPLETIONS: OK,
        EMBEDDINGS: OK,
    },
    "best_of": {CHAT: OK, COMPLETIONS: no("best_of is not supported"), EMBEDDINGS: OK},
    "suffix": {CHAT: OK, COMPLETIONS: no("suffix (insertion) is not supported"), EMBEDDINGS: OK},
}

NEUTRAL: dict[str, Any] = {
    "n": 1,
    "logprobs": False,
    "response_format": {"type": "text"},
    "tools": [],
    "parallel_tool_calls": True,
    "logit_bias": {},
    "functions": [],
    "echo": False,
    "best_of": 1,
    "probes": [],
    "modalities": ["text"],
}


def is_neutral(field: str, value: Any) -> bool:
    """null, or the field's "no change" value (compared with its type: true is not 1)."""
    if value is None:
        return True
    if field not in NEUTRAL:
        return False
    neutral = NEUTRAL[field]
    return value == neutral and type(value) is type(neutral)


def check_fields(body: dict[str, Any], endpoint: str, *, scoring: bool, streaming: bool) -> None:
    """400 field_not_honoured for the first field this endpoint cannot honour with this value."""
    for field, rules in MATRIX.items():
        if field not in body or is_neutral(field, body[field]):
            continue
        rule = rules[endpoint]
        value = body[field]
        refused = (
            rule.verdict == REFUSED
            or (rule.verdict == ABOVE_ONE and isinstance(value, int) and value > 1)
            or (
                rule.verdict == NOT_STREAMING and streaming and isinstance(value, int) and value > 1
            )
            or (rule.verdict == NOT_ON_SCORING and scoring)
        )
        if refused:
            raise FieldNotHonoured(f"{field} cannot be honoured here: {rule.why}", param=field)


def neutral_only(field: str) -> dict:
    """`field` is absent, null or its neutral value."""
    return one_of_values(field, [None, NEUTRAL[field]] if field in NEUTRAL else [None])


def schema_rules(endpoint: str) -> list[dict]:
    """The endpoint's column of the matrix as JSON Schema rules for the served OpenAPI schema:
    a refused field may only be null or neutral (those refused on scoring: scoring_refusals).
    The refused fields are one rule, not one each: schema tools give up on a body with too many
    `allOf` parts (schemathesis did on chat's once `audio` and `modalities` were refused), and the
    two say the same."""
    refused: dict = {}
    rules: list[dict] = [{"properties": refused}]
    for field, cells in MATRIX.items():
        verdict = cells[endpoint].verdict
        if verdict == REFUSED:
            refused.update(neutral_only(field)["properties"])
        elif verdict == ABOVE_ONE:
            rules.append(at_most(field, 1))
        elif verdict == NOT_STREAMING:
            rules.append(when(equals("stream", True), at_most(field, 1)))
    return rules


def scoring_refusals(endpoint: str) -> list[dict]:
    """What the endpoint's scoring requests may not send, as JSON Schema conditions (the scoring
    rules put them under one `if` per scoring case: schema tools handle few `if`s well)."""
    return [
        neutral_only(field)
        for field, cells in MATRIX.items()
        if cells[endpoint].verdict == NOT_ON_SCORING
    ]


# reported: fields a path does not use ------------------------------------------------------------
log = logging.getLogger("millm.requests")

# Message keys a chat template may or may not read; reported when the model's template does not.
TEMPLATE_KEYS = ("name", "tool_call_id", "tool_calls")
# Sampling fields scoring does not apply (temperature does: it divides the logits).
NOT_IN_SCORING = ("top_p", "stop", "frequency_penalty", "presence_penalty")
PRINTABLE_ASCII = "".join(chr(c) for c in range(0x20, 0x7F))


def percent_encode(name: str, also: str = "") -> str:
    """A name with characters outside printable ASCII, `%` and `also` percent-encoded (UTF-8)."""
    return quote(name, safe="".join(c for c in PRINTABLE_ASCII if c not in "%" + also))


def template_reads(tokenizer) -> set[str]:
    """Which optional message keys the model's chat template mentions (none for the generic
    fallback)."""
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
    # a key may hold anything
    return [percent_encode(f"chat_template_kwargs.{key}") for key in kwargs if key not in variables]


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
    if fields.get("tool_choice") is not None and not fields.get("tools"):
        found.append("tool_choice")  # no tools to choose among: "auto" and "none" change nothing
    if scoring:
        found += [key for key in NOT_IN_SCORING if fields.get(key) is not None]
    elif (
        fields.get("return_tokens_as_token_ids") is not None
        and getattr(body, "drawn_logprobs", None) is None  # keys generated tokens' logprobs
    ):
        found.append("return_tokens_as_token_ids")
    # a dict where not declared
    schema_format = getattr(getattr(body, "response_format", None), "json_schema", None)
    if getattr(schema_format, "description", None) is not None:
        # OpenAI shows it to its model; millm does not
        found.append("response_format.json_schema.description")
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


def unused_on_model(
    strict: bool,
    body: BaseModel,
    scoring: bool,
    lm: LoadedModel,
    unused: tuple[str, ...] = (),
    sent_as: SentAs = AS_SENT,
) -> tuple[str, ...]:
    """Fields this request sent that its path ignores on this model, plus `unused` ones (400 under
    X-miLLM-Strict), in the words of the body the client sent (`sent_as`)."""
    # An assistant's tool_calls are always rendered: by the template, or as <tool_call> blocks.
    reads = template_reads(lm.tokenizer) | {"tool_calls"}
    sent = body.model_dump(exclude_unset=True)
    locations = unused_locations(body, scoring=scoring, reads=reads) + [
        field for field in unused if sent.get(field) is not None
    ]
    locations += template_kwargs_unused(
        getattr(body, "chat_template_kwargs", None), lm.template_variables
    )
    return handle_unused(sent_as.merge(locations), strict)
