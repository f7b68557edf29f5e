"""/v1/responses, said as a chat request: one engine, policy and steering path for both APIs.

A Responses request becomes a ChatCompletionRequest (input items as messages, `instructions` as
a system message, flat function tools nested, `text.format` as `response_format`), is served by
`Serving.chat`, and its answer (or its stream of chunks) is turned back into a response object
(or the Responses event sequence). What the chat path reports or refuses is named in the
Responses body's words: `messages[3]` becomes `input[2]`, `response_format` `text.format`.

Stored responses (store/responses.py) hold the response object and the whole conversation it
answered, so `previous_response_id` continues one with a single read, on any replica.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from anyio import to_thread
from pydantic import TypeAdapter

from millm.errors import FieldNotHonoured, InvalidRequest, MillmError, NotFound, ResponseFormatUnsupported
from millm.protocol.requests import ChatCompletionRequest
from millm.protocol.responses import ChatCompletion, ChatCompletionChunk
from millm.protocol.responses_api import (
    TEXT_PARTS,
    ContentPart,
    DeletedResponse,
    Event,
    FunctionCallItem,
    FunctionCallOutput,
    FunctionCallOutputItem,
    IncompleteDetails,
    InputItem,
    InputItemList,
    InputTokensDetails,
    MessageItem,
    OtherItem,
    OutputItem,
    OutputMessage,
    OutputText,
    Response,
    ResponseError,
    ResponsesRequest,
    ResponseUsage,
    new_id,
)
from millm.protocol.unused_fields import SentAs, handle_unused, unused_locations
from millm.service.replies import Reply
from millm.service.serving import Serving
from millm.service.structured import NAME
from millm.store.database import Store
from millm.store.responses import delete_response, load_response, save_response

ITEMS: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])
EARLIER = "previous_response_id"  # where a location of an earlier turn points in an error
# Fields of the Responses body that change nothing on a local model (reported, refused under strict).
NO_EFFECT = ("reasoning", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "service_tier",
             "max_tool_calls", "stream_options")
HOSTED_TOOLS_WHY = "millm runs no hosted tools (web search, file search, computer use, MCP, code interpreter); send function tools"


def not_found(response_id: str, param: str | None = None) -> NotFound:
    """404 for a response that was never stored, was deleted, or is past the retention."""
    return NotFound(f"no stored response {response_id!r} (never stored, deleted, or past the retention)", param=param, code="response_not_found")


# input items -> chat messages ------------------------------------------------------------------------
def part_text(parts: str | list[ContentPart], where: str | None) -> str:
    """A content list's text, joined by newlines as chat joins text parts; other kinds are refused."""
    if isinstance(parts, str):
        return parts
    texts = []
    for k, part in enumerate(parts):
        if part.type in TEXT_PARTS and part.text is not None:
            texts.append(part.text)
        elif part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)
        else:
            raise FieldNotHonoured(
                f"content part of type {part.type!r} cannot be honoured: this model reads text only",
                param=f"{where or EARLIER}.content[{k}]",
            )
    return "\n".join(texts)


@dataclass
class Conversation:
    """Chat messages built from items, each with where it came from in this request (None: an earlier turn)."""

    messages: list[dict] = field(default_factory=list)
    where: list[str | None] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def add(self, message: dict, where: str | None) -> None:
        self.messages.append(message)
        self.where.append(where)

    def call(self, item: FunctionCallItem, where: str | None) -> None:
        """A function call joins the assistant turn just before it (parallel calls are one chat turn)."""
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            self.add({"role": "assistant", "content": None, "tool_calls": [call]}, where)


def conversation(instructions: str | None, items: list, first_new: int) -> Conversation:
    """The chat messages of `instructions` and `items` (those from `first_new` on are this request's `input`)."""
    built = Conversation()
    if instructions is not None:
        built.add({"role": "system", "content": instructions}, "instructions")
    for n, item in enumerate(items):
        where = f"input[{n - first_new}]" if n >= first_new else None
        if isinstance(item, MessageItem):
            built.add({"role": item.role, "content": part_text(item.content, where)}, where)
        elif isinstance(item, FunctionCallItem):
            built.call(item, where)
        elif isinstance(item, FunctionCallOutputItem):
            built.add({"role": "tool", "tool_call_id": item.call_id, "content": part_text(item.output, where)}, where)
        elif isinstance(item, OtherItem) and item.type == "reasoning":
            # Another model's reasoning, echoed back by an agent loop: nothing this model can read.
            if where is not None:
                built.ignored.append(where)
        else:
            raise FieldNotHonoured(
                f"input items of type {item.type!r} cannot be honoured: millm reads message, function_call and "
                "function_call_output items (an item_reference: send the item, or continue with previous_response_id)",
                param=f"{where or EARLIER}.type",
            )
    if not any(message["role"] != "system" for message in built.messages):
        raise InvalidRequest("input holds nothing to answer: send a message", param="input")
    return built


def stored_items(body: ResponsesRequest) -> list[dict]:
    """This request's input as stored items: a string becomes a user message; reasoning items are dropped."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    kept = [item for item in body.input if not (isinstance(item, OtherItem) and item.type == "reasoning")]
    return [{"type": "message", **item.model_dump(exclude_none=True, by_alias=True)} if isinstance(item, MessageItem)
            else item.model_dump(exclude_none=True, by_alias=True) for item in kept]


# the other fields -----------------------------------------------------------------------------------
def chat_tools(body: ResponsesRequest) -> list[dict] | None:
    """Flat function tools as chat's nested ones; hosted tools are refused."""
    if body.tools is None:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.type != "function":
            raise FieldNotHonoured(f"tools[{i}]: a {tool.type!r} tool cannot be honoured: {HOSTED_TOOLS_WHY}", param=f"tools[{i}].type")
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
    """{"type": "function", "name"} as chat's {"type": "function", "function": {"name"}}; hosted choices are refused."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise FieldNotHonoured(
        f"tool_choice {choice!r} cannot be honoured: name a function tool ({{\"type\": \"function\", \"name\": ...}}) or send "
        "\"auto\", \"none\" or \"required\"",
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
        raise ResponseFormatUnsupported(f"text.format: type {fmt.type!r} is not one of text, json_object, json_schema", param="text.format.type")
    if fmt.name is None or not NAME.match(fmt.name):
        raise ResponseFormatUnsupported("text.format.name is required: 1-64 letters, digits, '_' or '-'", param="text.format.name")
    if fmt.schema_ is None:
        raise ResponseFormatUnsupported("text.format.schema is required for a json_schema format", param="text.format.schema")
    spec = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
    return {"type": "json_schema", "json_schema": {key: value for key, value in spec.items() if value is not None}}


def own_ignored(body: ResponsesRequest, built: Conversation) -> list[str]:
    """Locations of the Responses body that change nothing here: unknown keys, NO_EFFECT fields sent, reasoning items."""
    found = unused_locations(body)  # unknown keys at every level, and user
    found += [name for name in NO_EFFECT if getattr(body, name) is not None]
    if body.text is not None and body.text.verbosity is not None:
        found.append("text.verbosity")
    # An ignored item is named once, not again with each of its keys.
    found = [location for location in found if not any(location.startswith(item + ".") for item in built.ignored)]
    return list(dict.fromkeys([*found, *built.ignored]))


def chat_request(body: ResponsesRequest, built: Conversation) -> ChatCompletionRequest:
    """The chat request that says what `body` says."""
    request: dict[str, Any] = {"model": body.model, "messages": built.messages, "stream": bool(body.stream)}
    if body.stream:
        request["stream_options"] = {"include_usage": True}  # the completed event carries usage
    pairs = {
        "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "tools": chat_tools(body), "tool_choice": chat_tool_choice(body.tool_choice), "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": chat_response_format(body), "seed": body.seed, "profile": body.profile,
        "steering_intensity": body.steering_intensity, "steering": body.steering,
        "return_sae_activations": body.return_sae_activations, "probes": body.probes,
    }
    request.update({key: value for key, value in pairs.items() if value is not None})
    return ChatCompletionRequest.model_validate(request, strict=False)


# chat locations -> Responses locations ----------------------------------------------------------------
RENAMES: list[tuple[re.Pattern, str | Callable[[re.Match], str]]] = [
    (re.compile(r"response_format\.json_schema\."), "text.format."),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bmax_(completion_)?tokens\b"), "max_output_tokens"),
    (re.compile(r"\bmessages\b"), "input"),
    (re.compile(r"(tools\[\d+\])\.function\b\.?"), lambda m: m.group(1) + ("." if m.group(0).endswith(".") else "")),
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


# chat answers -> responses -------------------------------------------------------------------------------
def echo(body: ResponsesRequest, response_id: str, stored: bool) -> Response:
    """A response object that repeats what was asked; output and usage come as the answer does."""
    tools = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
              "strict": True if t.strict is None else t.strict} for t in body.tools or []]
    text = body.text.model_dump(exclude_none=True, by_alias=True) if body.text is not None and body.text.format is not None else {"format": {"type": "text"}}
    return Response(
        id=response_id, status="in_progress", instructions=body.instructions, max_output_tokens=body.max_output_tokens,
        max_tool_calls=body.max_tool_calls, model=body.model, parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id, store=stored,
        temperature=1.0 if body.temperature is None else body.temperature, text=text,
        tool_choice=body.tool_choice if body.tool_choice is not None else "auto", tools=tools,
        top_p=1.0 if body.top_p is None else body.top_p, user=body.user, metadata=body.metadata or {},
    )


def usage_of(chat_usage) -> ResponseUsage | None:
    """Chat usage in the Responses API's names."""
    if chat_usage is None:
        return None
    return ResponseUsage(input_tokens=chat_usage.prompt_tokens, output_tokens=chat_usage.completion_tokens,
                         total_tokens=chat_usage.total_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=chat_usage.prompt_tokens_details.cached_tokens))


def finish(response: Response, reason: str | None, usage: ResponseUsage | None, extras: dict | None) -> Response:
    """The response once the answer is whole: completed, or incomplete when the token budget cut it."""
    cut = reason == "length"
    for item in response.output:
        item.status = "incomplete" if cut else "completed"
    return response.model_copy(update={
        "status": "incomplete" if cut else "completed", "completed_at": int(time.time()), "usage": usage, "millm": extras,
        "incomplete_details": IncompleteDetails(reason="max_output_tokens") if cut else None,
    })


def output_of(completion: ChatCompletion) -> tuple[list[OutputItem], str | None]:
    """A chat completion's single choice as output items (a message, then each call), and its finish reason."""
    choice = completion.choices[0]
    items: list[OutputItem] = []
    calls = choice.message.tool_calls or []
    if choice.message.content or not calls:
        items.append(OutputMessage(id=new_id("msg"), status="completed", content=[OutputText(text=choice.message.content or "")]))
    items += [FunctionCallOutput(id=new_id("fc"), call_id=call.id, name=call.function.name, arguments=call.function.arguments,
                                 status="completed") for call in calls]
    return items, choice.finish_reason


class EventStream:
    """Chat chunks as the Responses event sequence: created, in_progress, each output item added,
    its text deltas or call arguments, done; then completed (or incomplete); `error` then failed
    when the request fails partway."""

    def __init__(self, response: Response, where: list[str | None]):
        self.response = response
        self.where = where
        self.sequence = 0
        self.message: OutputMessage | None = None
        self.reason: str | None = None
        self.usage: ResponseUsage | None = None
        self.extras: dict = {}

    def event(self, type_: str, **fields) -> Event:
        event = Event(type=type_, sequence_number=self.sequence, **fields)
        self.sequence += 1
        return event

    def snapshot(self) -> dict:
        return self.response.model_dump()

    def opening(self) -> list[Event]:
        return [self.event("response.created", response=self.snapshot()), self.event("response.in_progress", response=self.snapshot())]

    def text(self, delta: str) -> list[Event]:
        events = []
        if self.message is None:
            self.message = OutputMessage(id=new_id("msg"), status="in_progress", content=[])
            self.response.output.append(self.message)
            index = len(self.response.output) - 1
            events.append(self.event("response.output_item.added", output_index=index, item=self.message.model_dump()))
            self.message.content.append(OutputText(text=""))
            events.append(self.event("response.content_part.added", item_id=self.message.id, output_index=index, content_index=0,
                                     part=self.message.content[0].model_dump()))
        self.message.content[0].text += delta
        events.append(self.event("response.output_text.delta", item_id=self.message.id, output_index=len(self.response.output) - 1,
                                 content_index=0, delta=delta, logprobs=[]))
        return events

    def close_message(self) -> list[Event]:
        message, self.message = self.message, None
        if message is None:
            return []
        index = self.response.output.index(message)
        message.status = "incomplete" if self.reason == "length" else "completed"
        part = message.content[0]
        return [
            self.event("response.output_text.done", item_id=message.id, output_index=index, content_index=0, text=part.text, logprobs=[]),
            self.event("response.content_part.done", item_id=message.id, output_index=index, content_index=0, part=part.model_dump()),
            self.event("response.output_item.done", output_index=index, item=message.model_dump()),
        ]

    def call(self, call) -> list[Event]:
        events = self.close_message()
        item = FunctionCallOutput(id=new_id("fc"), call_id=call.id, name=call.function.name, arguments="", status="in_progress")
        self.response.output.append(item)
        index = len(self.response.output) - 1
        events.append(self.event("response.output_item.added", output_index=index, item=item.model_dump()))
        item.arguments = call.function.arguments
        events.append(self.event("response.function_call_arguments.delta", item_id=item.id, output_index=index, delta=item.arguments))
        events.append(self.event("response.function_call_arguments.done", item_id=item.id, output_index=index, name=item.name,
                                 arguments=item.arguments))
        item.status = "completed"
        events.append(self.event("response.output_item.done", output_index=index, item=item.model_dump()))
        return events

    def chunk(self, chunk: ChatCompletionChunk) -> list[Event]:
        """What one chat chunk adds."""
        events: list[Event] = []
        if chunk.usage is not None:
            self.usage = usage_of(chunk.usage)
        if chunk.millm:
            self.extras.update(chunk.millm)
        for choice in chunk.choices:
            if choice.delta.content:
                events += self.text(choice.delta.content)
            for call in choice.delta.tool_calls or []:
                events += self.call(call)
            if choice.finish_reason is not None:
                self.reason = choice.finish_reason
        return events

    def closing(self) -> tuple[list[Event], Response]:
        """The last events, and the finished response they carry."""
        if not self.response.output:
            self.text("")  # an empty answer is still a message, as the whole response has it
        events = self.close_message()
        self.response = finish(self.response, self.reason, self.usage, self.extras or None)
        kind = "response.incomplete" if self.response.status == "incomplete" else "response.completed"
        return events + [self.event(kind, response=self.snapshot())], self.response

    def failure(self, error: MillmError) -> tuple[list[Event], Response]:
        """An error event, then the failed response."""
        error = in_responses_words(error, self.where)
        self.response = self.response.model_copy(update={
            "status": "failed", "error": ResponseError(code=error.code, message=error.message), "completed_at": int(time.time())})
        return [self.event("error", code=error.code, message=error.message, param=error.param),
                self.event("response.failed", response=self.snapshot())], self.response


class ResponsesApi:
    """POST, GET and DELETE /v1/responses (and a response's input items) over chat serving and the store."""

    def __init__(self, serving: Serving, store: Store):
        self.serving = serving
        self.store = store
        self.settings = serving.settings

    @property
    def retention_s(self) -> float:
        return self.settings.responses_retention_days * 86400

    async def create(self, body: ResponsesRequest, strict: bool) -> Reply:
        """Answer the input (after the stored conversation of previous_response_id), store it unless asked not to."""
        earlier: list[dict] = []
        if body.previous_response_id is not None:
            found = await to_thread.run_sync(load_response, self.store, body.previous_response_id, self.retention_s)
            if found is None:
                raise not_found(body.previous_response_id, param="previous_response_id")
            previous, items = found
            earlier = items + [item for item in previous["output"]]
        new = stored_items(body)
        built = conversation(body.instructions, ITEMS.validate_python(earlier) + (body.input if isinstance(body.input, list) else ITEMS.validate_python(new)),
                             len(earlier))
        ignored = own_ignored(body, built)
        handle_unused(ignored, strict)  # strict: refused before anything runs
        chat = chat_request(body, built)
        where = built.where
        sent_as = SentAs(tuple(ignored), lambda location: None if relocate(location, where).startswith(EARLIER) else relocate(location, where))
        try:
            reply = await self.serving.chat(chat, strict, sent_as)
        except MillmError as error:
            raise in_responses_words(error, where) from None
        stored = body.stored and self.settings.responses_max_stored > 0
        response = echo(body, new_id("resp"), stored)
        conversation_items = earlier + new
        if reply.chunks is not None:
            return Reply(reply.report, chunks=self._events(reply.chunks, response, where, conversation_items))
        assert isinstance(reply.body, ChatCompletion)
        output, reason = output_of(reply.body)
        response.output = output
        response = finish(response, reason, usage_of(reply.body.usage), reply.body.millm)
        await self._keep(response, conversation_items)
        return Reply(reply.report, body=response)

    async def _events(self, chunks: AsyncIterator, response: Response, where: list[str | None], items: list[dict]) -> AsyncIterator[Event]:
        stream = EventStream(response, where)
        try:
            for event in stream.opening():
                yield event
            async for chunk in chunks:
                if isinstance(chunk, MillmError):
                    events, failed = stream.failure(chunk)
                    await self._keep(failed, items)
                    for event in events:
                        yield event
                    return
                for event in stream.chunk(chunk):
                    yield event
            events, done = stream.closing()
            await self._keep(done, items)  # stored before the client hears "completed", so it can continue at once
            for event in events:
                yield event
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]  # an async generator: closing it cancels the job

    async def _keep(self, response: Response, items: list[dict]) -> None:
        if response.store:
            await to_thread.run_sync(save_response, self.store, response.model_dump(), with_ids(items),
                                     self.settings.responses_max_stored, self.retention_s)

    async def get(self, response_id: str) -> dict:
        """A stored response object."""
        found = await to_thread.run_sync(load_response, self.store, response_id, self.retention_s)
        if found is None:
            raise not_found(response_id)
        return found[0]

    async def delete(self, response_id: str) -> DeletedResponse:
        """Forget a stored response (404 when there is none)."""
        if not await to_thread.run_sync(delete_response, self.store, response_id):
            raise not_found(response_id)
        return DeletedResponse(id=response_id)

    async def input_items(self, response_id: str, limit: int, order: str, after: str | None) -> InputItemList:
        """A page of the conversation a stored response answered (earlier turns included)."""
        found = await to_thread.run_sync(load_response, self.store, response_id, self.retention_s)
        if found is None:
            raise not_found(response_id)
        items = found[1] if order == "asc" else list(reversed(found[1]))
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise InvalidRequest(f"after: no input item {after!r} in response {response_id!r}", param="after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return InputItemList(data=page, first_id=page[0]["id"] if page else None, last_id=page[-1]["id"] if page else None,
                             has_more=len(items) > limit)


def with_ids(items: list[dict]) -> list[dict]:
    """Items as stored: each with an id (OpenAI names input items too), so input_items can page by it."""
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
    return [item if item.get("id") else {"id": new_id(prefixes.get(item.get("type", "message"), "item")), **item} for item in items]
