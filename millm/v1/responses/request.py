"""A Responses request said as a chat request, and the chat path's locations said back in the
Responses body's words.

Input items become messages (`instructions` a system message first; consecutive function calls
one assistant turn), flat function tools chat's nested ones, `text.format` `response_format`.
Each message remembers where in this request it came from, so what the chat path reports or
refuses is named as the client sent it: `messages[3]` becomes `input[2]` (or
`previous_response_id` for an earlier turn), `response_format` `text.format`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from millm.errors import FieldNotHonoured, InvalidRequest, MillmError, ResponseFormatUnsupported
from millm.v1.policy.field_policy import SentAs, unused_locations
from millm.v1.policy.response_format import NAME
from millm.v1.responses.protocol import (
    TEXT_PARTS,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    OtherItem,
    ResponsesRequest,
)
from millm.v1.serving.protocol import ChatCompletionRequest

ITEMS: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])
EARLIER = "previous_response_id"  # where a location of an earlier turn points in an error
# Fields of the Responses body that change nothing on a local model (reported, refused under
# strict).
NO_EFFECT = (
    "reasoning",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "service_tier",
    "max_tool_calls",
    "stream_options",
)
HOSTED_TOOLS_WHY = (
    "millm runs no hosted tools (web search, file search, computer use, MCP, code "
    "interpreter); send function tools"
)


# input items -> chat messages ---------------------------------------------------------------------
def chat_content(parts: str | list[ContentPart]) -> str | list[dict]:
    """Content as chat's: text kinds (and a refusal's text) become text parts; any other kind is
    passed on as it is, for the chat path to refuse naming the part, as it refuses chat's own
    image parts."""
    if isinstance(parts, str):
        return parts
    chat_parts = []
    for part in parts:
        text = (
            part.refusal
            if part.type == "refusal"
            else part.text
            if part.type in TEXT_PARTS
            else None
        )
        chat_parts.append(
            {"type": "text", "text": text} if text is not None else {"type": part.type}
        )
    return chat_parts


@dataclass
class Conversation:
    """Chat messages built from items, each with where it came from in this request (None: an
    earlier turn)."""

    messages: list[dict] = field(default_factory=list)
    where: list[str | None] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def add(self, message: dict, where: str | None) -> None:
        """A message, and where it came from."""
        self.messages.append(message)
        self.where.append(where)

    def call(self, item: FunctionCallItem, where: str | None) -> None:
        """A function call joins the assistant turn just before it (parallel calls are one chat
        turn)."""
        call = {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            self.add({"role": "assistant", "content": None, "tool_calls": [call]}, where)


def conversation(instructions: str | None, items: list, first_new: int) -> Conversation:
    """The chat messages of `instructions` and `items` (those from `first_new` on are this
    request's `input`)."""
    built = Conversation()
    if instructions is not None:
        built.add({"role": "system", "content": instructions}, "instructions")
    for n, item in enumerate(items):
        where = f"input[{n - first_new}]" if n >= first_new else None
        if isinstance(item, MessageItem):
            built.add({"role": item.role, "content": chat_content(item.content)}, where)
        elif isinstance(item, FunctionCallItem):
            built.call(item, where)
        elif isinstance(item, FunctionCallOutputItem):
            built.add(
                {
                    "role": "tool",
                    "tool_call_id": item.call_id,
                    "content": chat_content(item.output),
                },
                where,
            )
        elif isinstance(item, OtherItem) and item.type == "reasoning":
            # Another model's reasoning, echoed back by an agent loop: nothing this model can read.
            if where is not None:
                built.ignored.append(where)
        else:
            raise FieldNotHonoured(
                f"input items of type {item.type!r} cannot be honoured: millm reads message, "
                "function_call and function_call_output items (an item_reference: send the item, "
                "or continue with previous_response_id)",
                param=f"{where or EARLIER}.type",
            )
    if not any(message["role"] != "system" for message in built.messages):
        raise InvalidRequest("input holds nothing to answer: send a message", param="input")
    return built


def stored_items(body: ResponsesRequest) -> list[dict]:
    """This request's input as stored items: a string becomes a user message; reasoning items are
    dropped."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    kept = [
        item
        for item in body.input
        if not (isinstance(item, OtherItem) and item.type == "reasoning")
    ]
    return [
        {"type": "message", **item.model_dump(exclude_none=True, by_alias=True)}
        if isinstance(item, MessageItem)
        else item.model_dump(exclude_none=True, by_alias=True)
        for item in kept
    ]


# the other fields ---------------------------------------------------------------------------------
def chat_tools(body: ResponsesRequest) -> list[dict] | None:
    """Flat function tools as chat's nested ones; hosted tools are refused."""
    if body.tools is None:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.type != "function":
            raise FieldNotHonoured(
                f"tools[{i}]: a {tool.type!r} tool cannot be honoured: {HOSTED_TOOLS_WHY}",
                param=f"tools[{i}].type",
            )
        if tool.name is None:
            raise InvalidRequest(f"tools[{i}].name is required", param=f"tools[{i}].name")
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.parameters is not None:
            function["parameters"] = tool.parameters
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    """{"type": "function", "name"} as chat's {"type": "function", "function": {"name"}}; hosted
    choices are refused."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise FieldNotHonoured(
        f'tool_choice {choice!r} cannot be honoured: name a function tool ({{"type": "function", '
        f'"name": ...}}) or send "auto", "none" or "required"',
        param="tool_choice",
    )


def chat_response_format(body: ResponsesRequest) -> dict | None:
    """text.format as response_format."""
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.type != "json_schema":
        raise ResponseFormatUnsupported(
            f"text.format: type {fmt.type!r} is not one of text, json_object, json_schema",
            param="text.format.type",
        )
    if fmt.name is None or not NAME.match(fmt.name):
        raise ResponseFormatUnsupported(
            "text.format.name is required: 1-64 letters, digits, '_' or '-'",
            param="text.format.name",
        )
    if fmt.schema_ is None:
        raise ResponseFormatUnsupported(
            "text.format.schema is required for a json_schema format", param="text.format.schema"
        )
    spec = {
        "name": fmt.name,
        "schema": fmt.schema_,
        "strict": fmt.strict,
        "description": fmt.description,
    }
    return {
        "type": "json_schema",
        "json_schema": {key: value for key, value in spec.items() if value is not None},
    }


def own_ignored(body: ResponsesRequest, built: Conversation) -> list[str]:
    """Locations of the Responses body that change nothing here: unknown keys, NO_EFFECT fields
    sent, reasoning items."""
    found = unused_locations(body)  # unknown keys at every level, and user
    found += [name for name in NO_EFFECT if getattr(body, name) is not None]
    if body.text is not None and body.text.verbosity is not None:
        found.append("text.verbosity")
    # An ignored item is named once, not again with each of its keys.
    found = [
        location
        for location in found
        if not any(location.startswith(item + ".") for item in built.ignored)
    ]
    return list(dict.fromkeys([*found, *built.ignored]))


def chat_request(body: ResponsesRequest, built: Conversation) -> ChatCompletionRequest:
    """The chat request that says what `body` says."""
    request: dict[str, Any] = {
        "model": body.model,
        "messages": built.messages,
        "stream": bool(body.stream),
    }
    if body.stream:
        request["stream_options"] = {"include_usage": True}  # the completed event carries usage
    pairs = {
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tools": chat_tools(body),
        "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": chat_response_format(body),
        "seed": body.seed,
        "profile": body.profile,
        "steering_intensity": body.steering_intensity,
        "steering": body.steering,
        "return_sae_activations": body.return_sae_activations,
        "probes": body.probes,
    }
    request.update({key: value for key, value in pairs.items() if value is not None})
    return ChatCompletionRequest.model_validate(request, strict=False)


# chat locations -> Responses locations ------------------------------------------------------------
RENAMES: list[tuple[re.Pattern, str | Callable[[re.Match], str]]] = [
    (re.compile(r"response_format\.json_schema\."), "text.format."),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bmax_(completion_)?tokens\b"), "max_output_tokens"),
    (re.compile(r"\bmessages\b"), "input"),
    (
        re.compile(r"(tools\[\d+\])\.function\b\.?"),
        lambda m: m.group(1) + ("." if m.group(0).endswith(".") else ""),
    ),
]
MESSAGE = re.compile(r"messages\[(\d+)\](\.tool_call_id\b)?")


def relocate(text: str, where: list[str | None]) -> str:
    """A chat location (or a message naming some) in the Responses body's words."""

    def message(m: re.Match) -> str:
        k = int(m.group(1))
        origin = where[k] if k < len(where) else None
        if origin is None:
            return EARLIER
        return origin + (".call_id" if m.group(2) else "")

    text = MESSAGE.sub(message, text)
    for pattern, replacement in RENAMES:
        text = pattern.sub(replacement, text)
    return text


def in_responses_words(error: MillmError, where: list[str | None]) -> MillmError:
    """The error with its param and message naming Responses fields."""
    error.message = relocate(error.message, where)
    if error.param is not None:
        error.param = relocate(error.param, where)
    return error


def sent_as(ignored: list[str], where: list[str | None]) -> SentAs:
    """How chat names ignored fields of this request: in its words, and not at all for an earlier
    turn's."""

    def locate(location: str) -> str | None:
        moved = relocate(location, where)
        return None if moved.startswith(EARLIER) else moved

    return SentAs(tuple(ignored), locate)
