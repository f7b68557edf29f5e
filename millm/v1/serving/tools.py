"""Tool calling on chat completions: `tools`, `tool_choice`, `parallel_tool_calls`.

Tools are offered through the model's chat template when it takes `tools`; otherwise in a
system message of a documented format (TOOL_PROMPT). Calls are written and parsed in one
format, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes/Qwen family's,
which most tool-capable templates use). `tool_choice`:

- "none": no tools are offered; the answer is text.
- "auto" (the default when tools are sent): the model decides; calls are parsed from its text.
- "required" / {"type": "function", "function": {"name": ...}}: the call is forced by constrained
  decoding over `{"name", "arguments"}` (or over the named tool's parameters), so it works for
  every model, with a tool template or not. A forced call always parses and validates.

Tool parameter schemas use the structured-output subset; anything outside it is refused as a
response_format keyword is (400 response_format_unsupported, naming keyword and pointer).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from millm.engine.constraints import COMPACT, GrammarSpec
from millm.engine.prompts import template_source
from millm.errors import InvalidRequest
from millm.formats.document_fields import field_error, refused_by
from millm.v1.policy.body_fields import OpenBody
from millm.v1.policy.response_format import NAME
from millm.v1.policy.schema_rules import any_of, equals, when
from millm.v1.policy.schema_subset import check_schema

TOOLS_PARAM = "tools"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
ANY_OBJECT = {"type": "object"}
TOOL_PROMPT = (
    "You can call functions. The functions you may call are listed below as JSON, one per line.\n"
    "{tools}\n"
    "To call a function, answer with one block per call and nothing else:\n"
    '<tool_call>{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}</tool_call>\n'
    "Call a function only when it helps to answer; otherwise answer normally."
)


class ToolFunction(OpenBody):
    """A function tool's function: its name, what it does, and the JSON Schema of its arguments."""

    name: Annotated[str, Field(pattern=NAME.pattern)]
    description: str | None = None
    # Within the structured-output subset (checked by tool_plan, which names keyword and pointer;
    # the served schema refers to the subset's own component).
    parameters: dict[str, Any] | None = None
    # OpenAI's SDK sends it; a forced call is constrained to the parameters whatever it says.
    strict: bool | None = None


class ChatTool(OpenBody):
    """One entry of a chat request's `tools`: `{"type": "function", "function": {...}}`."""

    type: Literal["function"]
    function: ToolFunction


TOOL_SHAPE = '{"type": "function", "function": {...}}'


def _refused_tool(exc: ValidationError, value: Any) -> InvalidRequest:
    # The first problem in the words tools were always refused in: the entry, its name, its
    # description.
    loc = exc.errors()[0]["loc"]
    if loc and isinstance(loc[0], int):
        where = f"{TOOLS_PARAM}[{loc[0]}]"
        part = loc[1:3]
        if part in ((), ("type",), ("function",)):
            return InvalidRequest(f"{where} must be {TOOL_SHAPE}", param=where)
        if part == ("function", "name"):
            return InvalidRequest(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-'",
                param=f"{where}.function.name",
            )
        if part == ("function", "description"):
            return InvalidRequest(
                f"{where}.function.description must be a string",
                param=f"{where}.function.description",
            )
    return field_error(exc, value, TOOLS_PARAM)


ChatTools = Annotated[list[ChatTool], refused_by(_refused_tool)]


class ChosenFunction(OpenBody):
    """The function a tool_choice names."""

    name: str


class NamedToolChoice(OpenBody):
    """tool_choice naming the one tool to call: `{"type": "function", "function": {"name":
    ...}}`."""

    type: Literal["function"]
    function: ChosenFunction


CHOICES = (
    'tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
    '{"name": ...}}'
)
ToolChoice = Annotated[
    Literal["none", "auto", "required"] | NamedToolChoice,
    refused_by(lambda exc, value: InvalidRequest(CHOICES, param="tool_choice")),
]
# A choice that forces a call needs tools to call (which one it names is checked against them).
TOOL_SCHEMA_RULES = [
    when(
        any_of(
            equals("tool_choice", "required"),
            {"required": ["tool_choice"], "properties": {"tool_choice": {"type": "object"}}},
        ),
        {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
    )
]


@dataclass(frozen=True)
class Tool:
    """One function tool: its name, description and the JSON Schema of its arguments."""

    name: str
    description: str | None
    parameters: dict

    def as_template(self) -> dict:
        """OpenAI's tool object, as chat templates expect it."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tool fields mean for generation and for reading the answer."""

    tools: tuple[Tool, ...]
    mode: str  # none | auto | required | forced
    forced: str | None = None  # the forced tool's name
    parallel: bool = True
    by_name: dict[str, Tool] = field(default_factory=dict, compare=False)

    @property
    def offered(self) -> bool:
        """Whether the prompt shows the tools."""
        return self.mode != "none" and bool(self.tools)

    @property
    def constrained(self) -> bool:
        """Whether the call is forced by constrained decoding."""
        return self.mode in ("required", "forced")

    def grammar(self) -> GrammarSpec | None:
        """The JSON Schema a forced call must follow: the named tool's arguments, or any tool's
        call."""
        if self.mode == "forced":
            assert self.forced is not None  # a forced plan names its tool
            return GrammarSpec(
                json.dumps(closed(self.by_name[self.forced].parameters)), COMPACT, "tools"
            )
        if self.mode == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": tool.name},
                        "arguments": closed(tool.parameters),
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for tool in self.tools
            ]
            return GrammarSpec(
                json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls}), COMPACT, "tools"
            )
        return None


def closed(schema):
    """The schema with `additionalProperties: false` wherever an object lists properties and says
    nothing of others: a forced call's arguments hold the declared properties (as OpenAI's strict
    function calling does), and a model cannot pad them with invented keys until max_tokens.
    What it generates still validates against the original schema."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: closed(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "additionalProperties"):
            out[key] = closed(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def tool_plan(
    tools: list[ChatTool] | None, choice: str | NamedToolChoice | None, parallel: bool | None
) -> ToolPlan | None:
    """The request's tool plan (None when it sends no tools), refusing tools sharing a name,
    parameters outside the subset and choices that name no tool sent."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequest(
                "tool_choice forces a call but no tools were sent", param="tool_choice"
            )
        return None
    checked = tuple(checked_tool(tool, i) for i, tool in enumerate(tools))
    by_name = {tool.name: tool for tool in checked}
    if len(by_name) != len(checked):
        raise InvalidRequest("tools: two tools share a name", param=TOOLS_PARAM)
    parallel = parallel is not False
    if choice is None or choice == "auto":
        return ToolPlan(checked, "auto", parallel=parallel, by_name=by_name)
    if choice in ("none", "required"):
        return ToolPlan(checked, choice, parallel=parallel, by_name=by_name)
    assert isinstance(choice, NamedToolChoice)  # the type allows nothing else
    name = choice.function.name
    if name not in by_name:
        raise InvalidRequest(
            f"tool_choice names {name!r}, which is not among the tools sent", param="tool_choice"
        )
    return ToolPlan(checked, "forced", forced=name, parallel=parallel, by_name=by_name)


def checked_tool(tool: ChatTool, index: int) -> Tool:
    """A parsed tool with its parameters checked against the subset (any object when it has
    none)."""
    function = tool.function
    parameters = ANY_OBJECT if function.parameters is None else function.parameters
    check_schema(parameters, param=f"{TOOLS_PARAM}[{index}].function.parameters")
    return Tool(function.name, function.description, parameters)


# prompts ---------------------------------------------------------------------------------------
PROMPTED_MIN_PARAMETERS = 1_000_000_000


def offer_decision(
    plan: ToolPlan | None, native: bool, parameters: int, setting: str
) -> tuple[ToolPlan | None, list[str]]:
    """Whether an "auto" request's tools are offered to a model whose template takes none: by
    MILLM_PROMPTED_TOOLS (auto: from 1B parameters; SmolLM2-135M made 0 calls in 20 tool-needing
    prompts). Not offered, the answer is text and the tool fields are reported ignored."""
    if plan is None or plan.mode != "auto" or native:
        return plan, []
    offer = setting == "on" or (setting == "auto" and parameters >= PROMPTED_MIN_PARAMETERS)
    if offer:
        return plan, []
    return ToolPlan(plan.tools, "none", parallel=plan.parallel, by_name=plan.by_name), [
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    ]


def template_takes_tools(tokenizer) -> bool:
    """Whether the model's chat template renders a `tools` list itself."""
    return re.search(r"\btools\b", template_source(tokenizer)) is not None


def tool_messages(messages: list[dict], plan: ToolPlan | None, native: bool) -> list[dict]:
    """The conversation as the template should see it: earlier calls and results in the call
    format, and (when the template takes no tools) the offered tools in a system message."""
    out = []
    for message in messages:
        message = dict(message)
        calls = message.pop("tool_calls", None)
        if calls:
            if native:
                message["tool_calls"] = [native_call(call) for call in calls]
            else:
                blocks = "".join(f"{OPEN}{json.dumps(call_body(call))}{CLOSE}" for call in calls)
                message["content"] = (message.get("content") or "") + blocks
        if message["role"] == "tool" and not native:
            # A template without tools may refuse unknown roles: results go back as a user turn.
            message = {
                "role": "user",
                "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>",
            }
        out.append(message)
    if plan is not None and plan.offered and not native:
        listed = "\n".join(json.dumps(tool.as_template()["function"]) for tool in plan.tools)
        offer = TOOL_PROMPT.format(tools=listed)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{offer}".strip()}
        else:
            out.insert(0, {"role": "system", "content": offer})
    return out


def call_body(call: dict) -> dict:
    """{"name", "arguments"} of an OpenAI tool call (arguments parsed when they are JSON)."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    return {"name": function.get("name"), "arguments": arguments}


def native_call(call: dict) -> dict:
    """An OpenAI tool call with its arguments as an object, as chat templates expect them."""
    body = call_body(call)
    return {"id": call.get("id"), "type": "function", "function": body}


# answers ---------------------------------------------------------------------------------------
