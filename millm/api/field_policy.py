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
EMBEDDINGS = "embeddings"
ALL = frozenset({CHAT, COMPLETIONS, EMBEDDINGS})


def _is(*neutral_values: Any) -> Callable[[Any], bool]:
    return lambda value: any(value == v and type(value) is type(v) for v in neutral_values)


def _text_format(value: Any) -> bool:
    return value == {"type": "text"}


NEUTRAL_EMPTY_LIST = _is([])
NEUTRAL_EMPTY_DICT = _is({})

# field -> (endpoints that refuse it, predicate for values that change nothing, why)
NOT_HONOURED: dict[str, tuple[frozenset[str], Callable[[Any], bool], str]] = {
    "logprobs": (ALL, _is(False), "log-probabilities are not returned yet"),
    "top_logprobs": (ALL, _is(), "log-probabilities are not returned yet"),
    "allowed_token_ids": (ALL, _is(), "token restriction is not supported yet"),
    "response_format": (ALL, _text_format, "structured output is not supported yet"),
    "profile": (frozenset({COMPLETIONS, EMBEDDINGS}), _is(), "a per-request profile applies to chat completions only"),
    "steering_intensity": (ALL, _is(), "the steering dial is not supported yet"),
    "steering": (ALL, _is(), "per-request steering is not implemented"),
    "dimensions": (ALL, _is(), "choosing the embedding size is not implemented"),
    "tools": (ALL, NEUTRAL_EMPTY_LIST, "tool calling is not supported yet"),
    "tool_choice": (ALL, _is(), "tool calling is not supported yet"),
    "functions": (frozenset({CHAT}), NEUTRAL_EMPTY_LIST, "function calling is not supported yet"),
    "function_call": (frozenset({CHAT}), _is(), "function calling is not supported yet"),
    "logit_bias": (ALL, NEUTRAL_EMPTY_DICT, "logit_bias is not supported"),
    "echo": (frozenset({COMPLETIONS}), _is(False), "echoing the prompt is not supported"),
    "best_of": (frozenset({COMPLETIONS}), _is(1), "best_of is not supported; use n"),
    "suffix": (frozenset({COMPLETIONS}), _is(), "suffix (insertion) is not supported"),
    "seed": (frozenset({EMBEDDINGS}), _is(), "embeddings are deterministic; a seed changes nothing"),
    "n": (frozenset({EMBEDDINGS}), _is(1), "an embedding has one result per input"),
    "max_completion_tokens": (frozenset({EMBEDDINGS}), _is(), "embeddings generate no tokens"),
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
