"""A constrained answer read back. A response_format document, once complete, is validated with
the jsonschema package: finish_reason "stop" then means "complete and valid", and a complete
document that fails is a 500 constrained_output_invalid, never a 200 (what a request may ask
for is checked while its body is parsed: v1/policy/response_format.py). A tool-calling answer's
<tool_call> blocks become OpenAI tool calls (checked against the offered tools' schemas), whole
or held back while streaming until a block closes."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import TypeGuard

from millm.errors import ConstrainedOutputInvalid
from millm.v1.policy.response_format import Structured
from millm.v1.serving.tools import CLOSE, OPEN, Tool, ToolPlan

CALL_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)


@dataclass
class ToolAnswer:
    """A choice's message once its text is read: content (or None) and tool calls."""

    content: str | None
    calls: list[dict]

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """tool_calls when calls were made, else what the engine said."""
        return "tool_calls" if self.calls else engine_reason


def new_call(name: str, arguments: dict) -> dict:
    """An OpenAI tool call object."""
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def valid_arguments(arguments: object, tool: Tool) -> TypeGuard[dict]:
    """Whether `arguments` is an object that validates against the tool's schema."""
    from jsonschema import Draft202012Validator

    return isinstance(arguments, dict) and not any(
        Draft202012Validator(tool.parameters).iter_errors(arguments)
    )


def read_answer(plan: ToolPlan, text: str, engine_reason: str | None, index: int) -> ToolAnswer:
    """Turn a finished choice's text into content and calls, by the plan's mode."""
    if plan.constrained:
        return read_forced(plan, text, engine_reason, index)
    if not plan.offered:
        return ToolAnswer(text, [])
    calls, spans = [], []
    for match in CALL_BLOCK.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict):
            continue
        name, arguments = body.get("name"), body.get("arguments", body.get("parameters", {}))
        # a name that is no string names no tool
        tool = plan.by_name.get(name) if isinstance(name, str) else None
        if tool is None or not valid_arguments(arguments, tool):
            continue
        calls.append(new_call(tool.name, arguments))
        spans.append(match.span())
    if not plan.parallel:
        calls, spans = calls[:1], spans[:1]
    if not calls:
        return ToolAnswer(text, [])
    rest, last = [], 0
    for start, end in spans:
        rest.append(text[last:start])
        last = end
    rest.append(text[last:])
    content = "".join(rest).strip()
    return ToolAnswer(content or None, calls)


def read_forced(plan: ToolPlan, text: str, engine_reason: str | None, index: int) -> ToolAnswer:
    """A forced call: the grammar made the text one JSON document; a cut one stays text."""
    if engine_reason != "stop":
        # cut by max_tokens: no call to report, the partial text is kept
        return ToolAnswer(text, [])
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstrainedOutputInvalid(
            f"choice {index}: the forced tool call is not valid JSON ({exc})"
        ) from None
    if plan.mode == "forced":
        name, arguments = plan.forced, document
    else:
        name, arguments = document.get("name"), document.get("arguments")
    # a name that is no string names no tool
    tool = plan.by_name.get(name) if isinstance(name, str) else None
    if tool is None or not valid_arguments(arguments, tool):
        raise ConstrainedOutputInvalid(
            f"choice {index}: the forced call to {name!r} does not validate against its parameters"
        )
    return ToolAnswer(None, [new_call(tool.name, arguments)])


class CallHoldback:
    """Streaming under "auto": passes text through until a call may be starting, then holds the
    rest, so a call's markup never reaches the client as content."""

    def __init__(self):
        self.held = ""
        self.calling = False

    def push(self, text: str) -> str:
        """Text safe to stream now."""
        if self.calling:
            self.held += text
            return ""
        combined = self.held + text
        at = combined.find(OPEN)
        if at >= 0:
            self.calling, self.held = True, combined[at:]
            return combined[:at]
        keep = next(
            (
                n
                for n in range(min(len(OPEN) - 1, len(combined)), 0, -1)
                if OPEN.startswith(combined[-n:])
            ),
            0,
        )
        self.held = combined[len(combined) - keep :]
        return combined[: len(combined) - keep]

    def flush(self) -> str:
        """Everything held (at the end of the choice)."""
        held, self.held = self.held, ""
        return held


def validate_output(structured: Structured, text: str, index: int) -> None:
    """A complete document must parse and validate; otherwise 500 constrained_output_invalid."""
    from jsonschema import Draft202012Validator

    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstrainedOutputInvalid(
            f"choice {index}: the completed output is not valid JSON ({exc})"
        ) from None
    if structured.mode == "json_object":
        if not isinstance(document, dict):
            raise ConstrainedOutputInvalid(
                f"choice {index}: the completed output is not a JSON object"
            )
        return
    error = next(iter(Draft202012Validator(structured.schema).iter_errors(document)), None)
    if error is not None:
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        raise ConstrainedOutputInvalid(
            f"choice {index}: the completed output fails the schema at {where}: {error.message}"
        )
