"""Rules of the /v1 generation bodies that read the body alone and take more than a line:
scoring mode's, return_sae_activations' one row, and the template variables a request may not
set. The request models check them while parsing (v1/serving/protocol.py); scoring's has its JSON
Schema twin for the served OpenAPI schema.
"""

from __future__ import annotations

from typing import Any, Protocol

from millm.engine.scoring import MIN_TEMPERATURE
from millm.errors import InvalidRequest
from millm.v1.policy.schema_rules import NULL, absent_or_null, any_of, at_most, equals, sent, when

READ_PARAM = "return_sae_activations"


class GenerationBody(Protocol):
    """What these rules read of a chat or text completion body (v1/serving/protocol.py)."""

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
            "scoring mode (logprobs / allowed_token_ids) needs max_tokens: 1 (or "
            "max_completion_tokens: 1), or 0 with echo: true: one forward pass, nothing generated",
            param="max_tokens",
        )
    if (body.n or 1) != 1:
        raise InvalidRequest("scoring mode needs n: 1", param="n")
    if body.stream:
        raise InvalidRequest("scoring mode cannot be streamed", param="stream")
    temperature = body.scoring_temperature
    if 0 < temperature < MIN_TEMPERATURE:
        raise InvalidRequest(
            f"temperature {temperature} would overflow the logits in scoring mode; use 0 (no "
            f"scaling) or at least {MIN_TEMPERATURE}",
            param="temperature",
        )


class EchoBody(GenerationBody, Protocol):
    """What check_echo reads of a text completion body."""

    @property
    def echo(self) -> bool | None: ...
    @property
    def allowed_token_ids(self) -> list[int] | None: ...


def check_echo(body: EchoBody) -> None:
    """echo (beyond the spec) puts the prompt before the completion, and with logprobs its tokens
    scored, as lm-evaluation-harness asks; max_tokens 0 is echo's alone (nothing generated)."""
    if body.token_budget == 0 and not body.echo:
        raise InvalidRequest(
            "max_tokens: 0 generates nothing; it is for echo: true (the prompt, scored with "
            "logprobs)",
            param="max_tokens",
        )
    if body.echo and body.allowed_token_ids is not None:
        raise InvalidRequest(
            "echo cannot be combined with allowed_token_ids: the prompt's tokens are scored over "
            "the whole vocabulary",
            param="echo",
        )


def scoring_schema_rules(
    logprobs: dict, refused: list[dict], also: tuple[dict, ...] = (), exact: bool = True
) -> list[dict]:
    """check_scoring's rules, and the fields `refused` on scoring, as JSON Schema. Scoring is
    allowed_token_ids (one token), `logprobs` with a one-token budget (with a longer one the
    tokens are generated: no rule), or one of `also` (text completions: max_tokens 0, echo's).
    Not `exact`: any `logprobs` is said as scoring, stricter than the server (logprobs while
    generating are served), because beside chat's other rules schemathesis's canonicaliser
    gives up on the exact conditionals and the schema could no longer be fuzzed."""
    temperature = {"anyOf": [NULL, {"const": 0}, {"minimum": MIN_TEMPERATURE}]}
    scored = [
        at_most("n", 1),
        {"properties": {"stream": {"enum": [None, False]}, "temperature": temperature}},
        *refused,
    ]
    one_token = any_of(equals("max_tokens", 1), equals("max_completion_tokens", 1))
    if not exact:
        return [when(any_of(logprobs, sent("allowed_token_ids")), {"allOf": [one_token, *scored]})]
    return [
        when(sent("allowed_token_ids"), {"allOf": [one_token, *scored]}),
        when(logprobs, when(one_token, {"allOf": scored})),
        *(when(condition, {"allOf": scored}) for condition in also),
    ]


def echo_schema_rules() -> list[dict]:
    """check_echo's rules as JSON Schema."""
    return [
        when(equals("max_tokens", 0), equals("echo", True)),
        when(equals("echo", True), absent_or_null("allowed_token_ids")),
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
            f"chat_template_kwargs may not set {', '.join(taken)}: millm renders these itself "
            "from the request",
            param=f"chat_template_kwargs.{taken[0]}",
        )
