"""Rules of the /v1 generation bodies that read the body alone and take more than a line:
scoring mode's, return_sae_activations' one row, and the template variables a request may not
set. The request models check them while parsing (protocol/requests.py); scoring's has its JSON
Schema twin for the served OpenAPI schema.
"""

from __future__ import annotations

from typing import Any, Protocol

from millm.engine.scoring import MIN_TEMPERATURE
from millm.errors import InvalidRequest
from millm.protocol.schema_rules import NULL, absent_or_null, any_of, at_most, equals, when

READ_PARAM = "return_sae_activations"


class GenerationBody(Protocol):
    """What these rules read of a chat or text completion body (protocol/requests.py)."""

    @property
    def n(self) -> int | None: ...
    @property
    def stream(self) -> bool | None: ...
    @property
    def return_sae_activations(self) -> dict[str, Any] | None: ...
    @property
    def token_budget(self) -> int | None: ...
    @property
    def scoring_temperature(self) -> float: ...


# Names in a chat template's namespace that millm fills from the request (or that are options of
# transformers' apply_chat_template rather than template variables).
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "tokenize",
        "return_dict",
        "return_assistant_tokens_mask",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "tokenizer_kwargs",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "raise_exception",
    }
)


def check_scoring(body: GenerationBody) -> None:
    """The API page's scoring-mode rules: one forward pass (max_tokens 1, n 1), not streamed, and
    a temperature that cannot overflow the logits."""
    echo = bool(getattr(body, "echo", None))
    if body.token_budget not in ((0, 1) if echo else (1,)):
        raise InvalidRequest(
            "scoring mode (logprobs / allowed_token_ids) needs max_tokens: 1 (or max_completion_tokens: 1), "
            "or 0 with echo: true: one forward pass, nothing generated",
            param="max_tokens",
        )
    if (body.n or 1) != 1:
        raise InvalidRequest("scoring mode needs n: 1", param="n")
    if body.stream:
        raise InvalidRequest("scoring mode cannot be streamed", param="stream")
    temperature = body.scoring_temperature
    if 0 < temperature < MIN_TEMPERATURE:
        raise InvalidRequest(
            f"temperature {temperature} would overflow the logits in scoring mode; use 0 (no scaling) or at least {MIN_TEMPERATURE}",
            param="temperature",
        )


class EchoBody(GenerationBody, Protocol):
    """What check_echo reads of a text completion body."""

    @property
    def echo(self) -> bool | None: ...
    @property
    def scoring(self) -> bool: ...
    @property
    def allowed_token_ids(self) -> list[int] | None: ...


def check_echo(body: EchoBody) -> None:
    """echo (beyond the spec) scores the prompt's own tokens: with logprobs, and max_tokens 0
    (the prompt alone) or 1 (the prompt and the next token), as lm-evaluation-harness asks."""
    if body.token_budget == 0 and not body.echo:
        raise InvalidRequest(
            "max_tokens: 0 generates nothing; it is for echo: true with logprobs (the prompt scored)",
            param="max_tokens",
        )
    if not body.echo:
        return
    if body.allowed_token_ids is not None:
        raise InvalidRequest(
            "echo cannot be combined with allowed_token_ids: the prompt's tokens are scored over the whole vocabulary",
            param="echo",
        )
    if not body.scoring:
        raise InvalidRequest(
            "echo needs logprobs (0 to 20) with max_tokens 0 or 1: it returns the prompt's tokens scored",
            param="echo",
        )


def scoring_schema_rules(scoring: dict) -> list[dict]:
    """check_scoring's rules as JSON Schema, under the endpoint's scoring condition."""
    return [
        when(
            scoring,
            {
                "allOf": [
                    any_of(
                        equals("max_tokens", 1),
                        equals("max_completion_tokens", 1),
                        {"allOf": [equals("echo", True), equals("max_tokens", 0)]},
                    ),
                    at_most("n", 1),
                    {"properties": {"stream": {"enum": [None, False]}}},
                    {
                        "properties": {
                            "temperature": {
                                "anyOf": [NULL, {"const": 0}, {"minimum": MIN_TEMPERATURE}]
                            }
                        }
                    },
                ]
            },
        )
    ]


def echo_schema_rules(scoring: dict) -> list[dict]:
    """check_echo's rules as JSON Schema, `scoring` being text completions' scoring condition."""
    return [
        when(equals("max_tokens", 0), equals("echo", True)),
        when(equals("echo", True), {"allOf": [scoring, absent_or_null("allowed_token_ids")]}),
    ]


def refuse_multi_row_reads(body: GenerationBody, prompts: int) -> None:
    """return_sae_activations reads one row: there is no single position axis across several."""
    if body.return_sae_activations is None:
        return
    if (body.n or 1) > 1:
        raise refused_read("n > 1 has several position axes; ask with n: 1")
    if getattr(body, "extra_messages", None):
        raise refused_read(
            "extra_messages rows have several position axes; ask without extra_messages"
        )
    if prompts > 1:
        raise refused_read("several prompts have several position axes; send one prompt")


def refused_read(message: str, code: str = "invalid_parameter") -> InvalidRequest:
    """A 400 naming return_sae_activations."""
    return InvalidRequest(f"{READ_PARAM}: {message}", param=READ_PARAM, code=code)


def check_template_kwargs(kwargs: dict | None) -> None:
    """chat_template_kwargs may not set what millm itself hands the template (or
    apply_chat_template's own options): it would silently replace the conversation, its tools or
    its turn."""
    taken = [key for key in kwargs or {} if key in RESERVED_TEMPLATE_VARIABLES]
    if taken:
        raise InvalidRequest(
            f"chat_template_kwargs may not set {', '.join(taken)}: millm renders these itself from the request",
            param=f"chat_template_kwargs.{taken[0]}",
        )
