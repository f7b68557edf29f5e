"""A request's text as token ids: chat conversations through the model's template (with the
offered tools), text prompts verbatim, embedding inputs; each failure names its location."""

from __future__ import annotations

from typing import Any

from millm.engine.loader import LoadedModel
from millm.engine.prompts import chat_prompt_ids, completion_prompt_ids
from millm.errors import (
    FieldNotHonoured,
    InputsTooLong,
    InvalidRequest,
    MillmError,
)
from millm.v1.policy.body_fields import listed_inputs
from millm.v1.serving.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from millm.v1.serving.tools import ToolPlan, template_takes_tools, tool_messages


def message_text(message: ChatMessage, where: str) -> str:
    """A message's content as one string; text parts are joined by newlines."""
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise FieldNotHonoured(
                f"content part of type {part.type!r} cannot be honoured: this model reads text "
                "only",
                param=f"{where}.content[{j}]",
            )
        texts.append(part.text)
    return "\n".join(texts)


def template_messages(messages: list[ChatMessage], param: str = "messages") -> list[dict]:
    """Messages as the chat template expects them; `developer` is OpenAI's newer name for
    `system`."""
    rendered = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": message_text(message, f"{param}[{i}]"),
        }
        for key in ("name", "tool_call_id"):
            value = getattr(message, key)
            if value is not None:
                entry[key] = value
        if message.tool_calls is not None:
            entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        rendered.append(entry)
    return rendered


def conversation_prompts(
    lm: LoadedModel, body: ChatCompletionRequest, tools: ToolPlan | None = None
) -> list[list[int]]:
    """Token ids of `messages` and of each `extra_messages` conversation, with the offered tools;
    a failure names which conversation."""
    conversations = [("messages", body.messages)]
    conversations += [
        (f"extra_messages[{i}]", msgs) for i, msgs in enumerate(body.extra_messages or [])
    ]
    variables = template_kwargs(lm, body.chat_template_kwargs)
    return [
        conversation_ids(lm, messages, param, tools, variables) for param, messages in conversations
    ]


def template_kwargs(lm: LoadedModel, sent: dict[str, Any] | None) -> dict[str, Any]:
    """The chat_template_kwargs the model's template reads (the others are reported as ignored)."""
    readable = lm.template_variables or frozenset()
    return {key: value for key, value in (sent or {}).items() if key in readable}


def conversation_ids(
    lm: LoadedModel,
    messages: list[ChatMessage],
    param: str = "messages",
    tools: ToolPlan | None = None,
    variables: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of one conversation through the model's chat template, with the offered tools
    and extra template `variables`; a failure names `param`."""
    native = template_takes_tools(lm.tokenizer)
    listed = (
        [tool.as_template() for tool in tools.tools]
        if native and tools is not None and tools.offered
        else None
    )
    try:
        prompt = chat_prompt_ids(
            lm.tokenizer,
            tool_messages(template_messages(messages, param), tools, native),
            listed,
            variables,
        )
    except MillmError as exc:
        if param != "messages" and exc.param == "messages":  # the template's own complaint
            exc.param = param
            exc.message = f"{param}: {exc.message}"
        raise
    if not prompt:
        raise InvalidRequest(f"the rendered conversation {param} tokenises to nothing", param=param)
    return prompt


def token_ids(
    lm: LoadedModel, entry, param: str, error: type[InvalidRequest], add_special: bool = True
) -> list[int]:
    """One text (tokenised verbatim) or token-id list, checked against the vocabulary."""
    ids = (
        completion_prompt_ids(lm.tokenizer, entry, add_special)
        if isinstance(entry, str)
        else list(entry)
    )
    if not ids:
        raise error(f"{param} tokenises to nothing; a prompt needs at least one token", param=param)
    bad = [t for t in ids if not 0 <= t < lm.vocab_size]
    if bad:
        raise error(
            f"{param} holds token ids outside the vocabulary (0..{lm.vocab_size - 1}): {bad[:5]}",
            param=param,
        )
    return ids


def completion_prompts(
    lm: LoadedModel, body: CompletionRequest, error: type[InvalidRequest]
) -> tuple[list[list[int]], list[str]]:
    """Every prompt of a text completion as token ids (verbatim, no chat template), with its
    text."""
    items = listed_inputs(body.prompt)
    add_special = True if body.add_special_tokens is None else body.add_special_tokens
    prompts: list[list[int]] = []
    texts: list[str] = []
    for i, entry in enumerate(items):
        ids = token_ids(
            lm, entry, "prompt" if len(items) == 1 else f"prompt[{i}]", error, add_special
        )
        prompts.append(ids)
        texts.append(entry if isinstance(entry, str) else lm.tokenizer.decode(ids))  # type: ignore[arg-type]  # transformers types decode() as str | list[str]; one id list decodes to a str
    return prompts, texts


def embedding_inputs(lm: LoadedModel, value) -> list[list[int]]:
    """Every embeddings input as token ids, checked against the vocabulary, then all of them
    against the context window (one 400 naming every input over it: none is truncated)."""
    items = listed_inputs(value)
    wheres = ["input"] if len(items) == 1 else [f"input[{i}]" for i in range(len(items))]
    prompts = [
        token_ids(lm, item, where, InvalidRequest)
        for item, where in zip(items, wheres, strict=True)
    ]
    limit = lm.context_length
    over = [
        (where, len(ids)) for where, ids in zip(wheres, prompts, strict=True) if len(ids) > limit
    ]
    if over:
        raise InputsTooLong(limit=lm.context_length, over=over)
    return prompts
