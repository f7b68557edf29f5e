"""The field_not_honoured matrix: which output-changing fields each endpoint honours or refuses.

One table (MATRIX) drives both the check and its tests; it is the API page's table, column by
column (the GGUF columns arrive with that engine), plus a few legacy OpenAI fields the page
does not list but that would change the output (functions, echo, best_of, suffix). A field is
refused only when its value would change something: null and the neutral values (n: 1,
logprobs: false, response_format {"type": "text"}, tools: [], logit_bias: {}) pass everywhere.
The check runs before the requested model is looked at, let alone loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from millm.errors import FieldNotHonoured
from millm.protocol.schema_rules import at_most, equals, one_of_values, when

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
    "profile": {
        CHAT: Rule(NOT_ON_SCORING, "scoring is never steered"),
        COMPLETIONS: no("a per-request profile applies to chat completions"),
        EMBEDDINGS: no("embeddings are never steered"),
    },
    "steering_intensity": {
        CHAT: Rule(NOT_ON_SCORING, "scoring is never steered"),
        COMPLETIONS: no("the steering dial applies to chat completions"),
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
    "dimensions": {e: no("choosing the embedding size is not implemented yet") for e in ENDPOINTS},
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
    "echo": {CHAT: OK, COMPLETIONS: no("echoing the prompt is not supported"), EMBEDDINGS: OK},
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


# /v1/responses (beyond the spec: issue 22) says chat's fields in other words and is checked as chat
# once translated; these are the Responses API's own output-changing fields it cannot honour, each
# with the values that change nothing.
RESPONSES_REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "background": ((False,), "there is no background mode; wait for the answer or stream it"),
    "conversation": (
        (),
        "millm keeps no conversation objects; continue a stored response with previous_response_id",
    ),
    "prompt": (
        (),
        "stored prompt templates live on OpenAI's platform; send instructions and input",
    ),
    "include": (
        ([],),
        "millm adds no optional output (logprobs, reasoning, search results) to a response",
    ),
    "top_logprobs": (
        (0,),
        "log-probabilities are not returned on /v1/responses; use /v1/chat/completions with logprobs",
    ),
    "truncation": (
        ("disabled",),
        "millm never drops earlier items to fit; a conversation too long is a 400 context_length_exceeded",
    ),
    "context_management": (([],), "millm compacts no context"),
}


def check_responses_fields(body: dict[str, Any]) -> None:
    """400 field_not_honoured for the first Responses field whose value would change what millm cannot change."""
    for field, (neutral, why) in RESPONSES_REFUSED.items():
        value = body.get(field)
        if value is None or any(value == n and type(value) is type(n) for n in neutral):
            continue
        raise FieldNotHonoured(f"{field} cannot be honoured here: {why}", param=field)


def schema_rules(endpoint: str, scoring: dict | None = None) -> list[dict]:
    """The endpoint's column of the matrix as JSON Schema rules for the served OpenAPI schema:
    a refused field may only be null or neutral; `scoring` is the endpoint's scoring condition."""
    rules = []
    for field, cells in MATRIX.items():
        verdict = cells[endpoint].verdict
        neutral_only = one_of_values(field, [None, NEUTRAL[field]] if field in NEUTRAL else [None])
        if verdict == REFUSED:
            rules.append(neutral_only)
        elif verdict == ABOVE_ONE:
            rules.append(at_most(field, 1))
        elif verdict == NOT_STREAMING:
            rules.append(when(equals("stream", True), at_most(field, 1)))
        elif verdict == NOT_ON_SCORING and scoring is not None:
            rules.append(when(scoring, neutral_only))
    return rules
