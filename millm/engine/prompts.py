"""Turning chat messages and completion prompts into token ids.

The model's own chat template is used when it has one; a documented generic template otherwise
(generation only). A trailing assistant message is continued, not answered anew: everything
before it is rendered with a generation prompt and the partial answer is appended raw.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta

from millm.errors import InvalidRequest

# For models without a template (mostly base models): plain "Role: text" turns, which base
# models continue sensibly, opened by the BOS token when the tokenizer has one.
FALLBACK_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer ships its own chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def template_source(tokenizer) -> str:
    """The chat template's text (every named template of a dict joined), or '' without one."""
    source = getattr(tokenizer, "chat_template", None) or ""
    return " ".join(source.values()) if isinstance(source, dict) else source


class _GenerationTag(jinja2.ext.Extension):
    """Parses transformers' `{% generation %}...{% endgeneration %}` (it marks assistant tokens)
    as its body."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@functools.lru_cache(maxsize=32)
def _variables(source: str) -> frozenset[str]:
    environment = jinja2.Environment(extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(source)))
    except jinja2.TemplateSyntaxError:
        return frozenset()  # such a template fails at render time too, with its own message


def template_variables(tokenizer) -> frozenset[str]:
    """The variables the model's chat template reads from outside (messages, bos_token,
    enable_thinking, ...)."""
    return _variables(template_source(tokenizer))


def _apply_template(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    variables: dict[str, Any] | None = None,
) -> str:
    template = None if has_chat_template(tokenizer) else FALLBACK_CHAT_TEMPLATE
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=False,
            **(variables or {}),
        )
    except Exception as exc:  # jinja2 errors, including the template's own raise_exception()
        message = str(exc).strip() or type(exc).__name__
        raise InvalidRequest(
            f"the model's chat template refused these messages: {message}", param="messages"
        ) from None


# Stands in for a lone partial answer while the template renders it (private-use characters).
PARTIAL_MARK = "\ue000millm-partial\ue000"


def render_chat(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    variables: dict[str, Any] | None = None,
) -> str:
    """The prompt text for a conversation (with `tools` for templates that take them, and extra
    template `variables` such as enable_thinking); a trailing assistant message without tool
    calls is continued."""
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        partial = messages[-1].get("content") or ""
        if len(messages) == 1:
            return _lone_partial(tokenizer, messages[0], partial, tools, variables)
        return _apply_template(tokenizer, messages[:-1], tools, variables) + partial
    return _apply_template(tokenizer, messages, tools, variables)


def _lone_partial(
    tokenizer,
    message: dict,
    partial: str,
    tools: list[dict] | None,
    variables: dict[str, Any] | None,
) -> str:
    # Nothing precedes the partial, and templates render no empty conversation: render the turn
    # with a mark for its content and cut there, so the template's own opening (a default
    # system prompt, the assistant header) comes first, as vLLM's continue_final_message does.
    rendered = _apply_template(tokenizer, [{**message, "content": PARTIAL_MARK}], tools, variables)
    cut = rendered.rfind(PARTIAL_MARK)
    if cut < 0:
        raise InvalidRequest(
            "a conversation of one assistant message is continued, but this model's chat template "
            "does not render the message's text as given; send the turns before it",
            param="messages",
        )
    return rendered[:cut] + partial


def chat_prompt_ids(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    variables: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a rendered conversation; the template already carries any BOS it needs."""
    return tokenizer(render_chat(tokenizer, messages, tools, variables), add_special_tokens=False)[
        "input_ids"
    ]


def completion_prompt_ids(tokenizer, prompt: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of a verbatim completion prompt, by default with the tokenizer's special tokens
    (BOS)."""
    return tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
