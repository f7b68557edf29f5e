"""A chat answer said as a Responses response object: whole, or as the Responses event sequence."""

from __future__ import annotations

import time

from millm.errors import MillmError
from millm.v1.objects import ChatCompletion, ChatCompletionChunk
from millm.v1.responses.protocol import (
    Event,
    FunctionCallOutput,
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    Response,
    ResponseError,
    ResponsesRequest,
    ResponseUsage,
    new_id,
)
from millm.v1.responses.request import in_responses_words


# chat answers -> responses ------------------------------------------------------------------------
def echo(body: ResponsesRequest, response_id: str, stored: bool) -> Response:
    """A response object that repeats what was asked; output and usage come as the answer does."""
    tools = [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": True if t.strict is None else t.strict,
        }
        for t in body.tools or []
    ]
    text = (
        body.text.model_dump(exclude_none=True, by_alias=True)
        if body.text is not None and body.text.format is not None
        else {"format": {"type": "text"}}
    )
    return Response(
        id=response_id,
        status="in_progress",
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        max_tool_calls=body.max_tool_calls,
        model=body.model,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id,
        store=stored,
        temperature=1.0 if body.temperature is None else body.temperature,
        text=text,
        tool_choice=body.tool_choice if body.tool_choice is not None else "auto",
        tools=tools,
        top_p=1.0 if body.top_p is None else body.top_p,
        user=body.user,
        metadata=body.metadata or {},
    )


def usage_of(chat_usage) -> ResponseUsage | None:
    """Chat usage in the Responses API's names."""
    if chat_usage is None:
        return None
    return ResponseUsage(
        input_tokens=chat_usage.prompt_tokens,
        output_tokens=chat_usage.completion_tokens,
        total_tokens=chat_usage.total_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=chat_usage.prompt_tokens_details.cached_tokens
        ),
    )


def finish(
    response: Response, reason: str | None, usage: ResponseUsage | None, extras: dict | None
) -> Response:
    """The response once the answer is whole: completed, or incomplete when the token budget cut
    it."""
    cut = reason == "length"
    for item in response.output:
        item.status = "incomplete" if cut else "completed"
    return response.model_copy(
        update={
            "status": "incomplete" if cut else "completed",
            "completed_at": int(time.time()),
            "usage": usage,
            "millm": extras,
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if cut else None,
        }
    )


def output_of(completion: ChatCompletion) -> tuple[list[OutputItem], str | None]:
    """A chat completion's single choice as output items (a message, then each call), and its
    finish reason."""
    choice = completion.choices[0]
    items: list[OutputItem] = []
    calls = choice.message.tool_calls or []
    if choice.message.content or not calls:
        items.append(
            OutputMessage(
                id=new_id("msg"),
                status="completed",
                content=[OutputText(text=choice.message.content or "")],
            )
        )
    items += [
        FunctionCallOutput(
            id=new_id("fc"),
            call_id=call.id,
            name=call.function.name,
            arguments=call.function.arguments,
            status="completed",
        )
        for call in calls
    ]
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
        """The next event of the stream, numbered."""
        event = Event(type=type_, sequence_number=self.sequence, **fields)
        self.sequence += 1
        return event

    def snapshot(self) -> dict:
        """The response as it stands, for a lifecycle event."""
        return self.response.model_dump()

    def opening(self) -> list[Event]:
        """created, then in_progress."""
        return [
            self.event("response.created", response=self.snapshot()),
            self.event("response.in_progress", response=self.snapshot()),
        ]

    def text(self, delta: str) -> list[Event]:
        """A text delta (opening the message and its part first)."""
        events = []
        if self.message is None:
            self.message = OutputMessage(id=new_id("msg"), status="in_progress", content=[])
            self.response.output.append(self.message)
            index = len(self.response.output) - 1
            events.append(
                self.event(
                    "response.output_item.added", output_index=index, item=self.message.model_dump()
                )
            )
            self.message.content.append(OutputText(text=""))
            events.append(
                self.event(
                    "response.content_part.added",
                    item_id=self.message.id,
                    output_index=index,
                    content_index=0,
                    part=self.message.content[0].model_dump(),
                )
            )
        self.message.content[0].text += delta
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=self.message.id,
                output_index=len(self.response.output) - 1,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return events

    def close_message(self) -> list[Event]:
        """The open message's done events (none when no message is open)."""
        message, self.message = self.message, None
        if message is None:
            return []
        index = self.response.output.index(message)
        message.status = "incomplete" if self.reason == "length" else "completed"
        part = message.content[0]
        return [
            self.event(
                "response.output_text.done",
                item_id=message.id,
                output_index=index,
                content_index=0,
                text=part.text,
                logprobs=[],
            ),
            self.event(
                "response.content_part.done",
                item_id=message.id,
                output_index=index,
                content_index=0,
                part=part.model_dump(),
            ),
            self.event("response.output_item.done", output_index=index, item=message.model_dump()),
        ]

    def call(self, call) -> list[Event]:
        """A whole function call as its item's events (chat hands calls over whole, when the row
        ends)."""
        events = self.close_message()
        item = FunctionCallOutput(
            id=new_id("fc"),
            call_id=call.id,
            name=call.function.name,
            arguments="",
            status="in_progress",
        )
        self.response.output.append(item)
        index = len(self.response.output) - 1
        events.append(
            self.event("response.output_item.added", output_index=index, item=item.model_dump())
        )
        item.arguments = call.function.arguments
        events.append(
            self.event(
                "response.function_call_arguments.delta",
                item_id=item.id,
                output_index=index,
                delta=item.arguments,
            )
        )
        events.append(
            self.event(
                "response.function_call_arguments.done",
                item_id=item.id,
                output_index=index,
                name=item.name,
                arguments=item.arguments,
            )
        )
        item.status = "completed"
        events.append(
            self.event("response.output_item.done", output_index=index, item=item.model_dump())
        )
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
        kind = (
            "response.incomplete" if self.response.status == "incomplete" else "response.completed"
        )
        return events + [self.event(kind, response=self.snapshot())], self.response

    def failure(self, error: MillmError) -> tuple[list[Event], Response]:
        """An error event, then the failed response."""
        error = in_responses_words(error, self.where)
        self.response = self.response.model_copy(
            update={
                "status": "failed",
                "error": ResponseError(code=error.code, message=error.message),
                "completed_at": int(time.time()),
            }
        )
        return [
            self.event("error", code=error.code, message=error.message, param=error.param),
            self.event("response.failed", response=self.snapshot()),
        ], self.response
