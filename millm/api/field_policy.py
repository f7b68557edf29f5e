"""Which output-changing fields each endpoint cannot honour yet: refused, never silently dropped.

One table drives both the check and its tests. A field is refused only when its value would
change the output; the spec's neutral values (null, n: 1, logprobs: false,
response_format {"type": "text"}, tools: [], logit_bias: {}, echo: false, best_of: 1) pass.
"""

from __future__ import annotations

from typing import Any, Callable

from millm.errors import FieldNotHonoured

CHAT = "chat"
COMPLETIONS = "completions"


def _is(*neutral_values: Any) -> Callable[[Any], bool]:
    return lambda value: any(value == v and type(value) is type(v) for v in neutral_values)


def _text_format(value: Any) -> bool:
    return value == {"type": "text"}


NEUTRAL_EMPTY_LIST = _is([])
NEUTRAL_EMPTY_DICT = _is({})

# field -> (endpoints that refuse it, predicate for values that change nothing, why)
NOT_HONOURED: dict[str, tuple[frozenset[str], Callable[[Any], bool], str]] = {
    "logprobs": (frozenset({CHAT, COMPLETIONS}), _is(False), "log-probabilities are not returned yet"),
    "top_logprobs": (frozenset({CHAT, COMPLETIONS}), _is(), "log-probabilities are not returned yet"),
    "allowed_token_ids": (frozenset({CHAT, COMPLETIONS}), _is(), "token restriction is not supported yet"),
    "response_format": (frozenset({CHAT, COMPLETIONS}), _text_format, "structured output is not supported yet"),
    "profile": (frozenset({CHAT, COMPLETIONS}), _is(), "steering profiles are not supported yet"),
    "steering_intensity": (frozenset({CHAT, COMPLETIONS}), _is(), "steering is not supported yet"),
    "steering": (frozenset({CHAT, COMPLETIONS}), _is(), "per-request steering is not implemented"),
    "dimensions": (frozenset({CHAT, COMPLETIONS}), _is(), "dimensions applies to embeddings only"),
    "tools": (frozenset({CHAT, COMPLETIONS}), NEUTRAL_EMPTY_LIST, "tool calling is not supported yet"),
    "tool_choice": (frozenset({CHAT, COMPLETIONS}), _is(), "tool calling is not supported yet"),
    "functions": (frozenset({CHAT}), NEUTRAL_EMPTY_LIST, "function calling is not supported yet"),
    "function_call": (frozenset({CHAT}), _is(), "function calling is not supported yet"),
    "logit_bias": (frozenset({CHAT, COMPLETIONS}), NEUTRAL_EMPTY_DICT, "logit_bias is not supported"),
    "echo": (frozenset({COMPLETIONS}), _is(False), "echoing the prompt is not supported"),
    "best_of": (frozenset({COMPLETIONS}), _is(1), "best_of is not supported; use n"),
    "suffix": (frozenset({COMPLETIONS}), _is(), "suffix (insertion) is not supported"),
}


def refuse_unhonoured(body: dict[str, Any], endpoint: str) -> None:
    """Raise 400 field_not_honoured for the first field in `body` this endpoint cannot honour."""
    for field, (endpoints, neutral, why) in NOT_HONOURED.items():
        if endpoint not in endpoints or field not in body:
            continue
        value = body[field]
        if value is None or neutral(value):
            continue
        raise FieldNotHonoured(f"{field} cannot be honoured on this endpoint: {why}", param=field)
