"""/v1/responses, said as a chat request: one engine, policy and steering path for both APIs.

A Responses request becomes a ChatCompletionRequest (v1/responses/request.py), is served by
`Serving.chat`, and its answer (or its stream of chunks) becomes a response object or the
Responses event sequence (v1/responses/answer.py).

Stored responses (v1/responses/store.py) hold the response object and the whole conversation it
answered, so `previous_response_id` continues one with a single read, on any replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from anyio import to_thread

from millm.errors import InvalidRequest, MillmError, NotFound
from millm.store.database import Store
from millm.v1.objects import ChatCompletion
from millm.v1.policy.field_policy import handle_unused
from millm.v1.responses.answer import EventStream, echo, finish, output_of, usage_of
from millm.v1.responses.protocol import (
    DeletedResponse,
    Event,
    InputItemList,
    Response,
    ResponsesRequest,
    new_id,
)
from millm.v1.responses.request import (
    ITEMS,
    chat_request,
    conversation,
    in_responses_words,
    own_ignored,
    sent_as,
    stored_items,
)
from millm.v1.responses.store import delete_response, load_response, save_response
from millm.v1.serving.replies import Reply
from millm.v1.serving.serving import Serving


def not_found(response_id: str, param: str | None = None) -> NotFound:
    """404 for a response that was never stored, was deleted, or is past the retention."""
    return NotFound(
        f"no stored response {response_id!r} (never stored, deleted, or past the retention)",
        param=param,
        code="response_not_found",
    )


class ResponsesApi:
    """POST, GET and DELETE /v1/responses (and a response's input items) over chat serving and
    the store."""

    def __init__(self, serving: Serving, store: Store):
        self.serving = serving
        self.store = store
        self.settings = serving.settings

    @property
    def retention_s(self) -> float:
        """How long a stored response is kept, in seconds."""
        return self.settings.responses_retention_days * 86400

    async def create(self, body: ResponsesRequest, strict: bool) -> Reply:
        """Answer the input (after the stored conversation of previous_response_id), store it
        unless asked not to."""
        earlier: list[dict] = []
        if body.previous_response_id is not None:
            found = await to_thread.run_sync(
                load_response, self.store, body.previous_response_id, self.retention_s
            )
            if found is None:
                raise not_found(body.previous_response_id, param="previous_response_id")
            previous, items = found
            earlier = items + [item for item in previous["output"]]
        new = stored_items(body)
        # This request's items as sent (their indices are what errors and reports name; stored ones
        # drop reasoning).
        sent = body.input if isinstance(body.input, list) else ITEMS.validate_python(new)
        built = conversation(body.instructions, ITEMS.validate_python(earlier) + sent, len(earlier))
        ignored = own_ignored(body, built)
        handle_unused(ignored, strict)  # strict: refused before anything runs
        where = built.where
        try:
            # The chat request's own rules run as it is made: their errors are said in this API's
            # words too.
            chat = chat_request(body, built)
            response_id = new_id("resp")  # before it runs: monitoring names the request by it
            reply = await self.serving.chat(chat, strict, sent_as(ignored, where), response_id)
        except MillmError as error:
            raise in_responses_words(error, where) from None
        stored = body.stored and self.settings.responses_max_stored > 0
        response = echo(body, response_id, stored)
        conversation_items = earlier + new
        if reply.chunks is not None:
            # Responses events have no place for the chat stream's last chunk: the header says it.
            return Reply(
                replace(reply.report, in_stream=False),
                chunks=self._events(reply.chunks, response, where, conversation_items),
            )
        assert isinstance(reply.body, ChatCompletion)
        output, reason = output_of(reply.body)
        response.output = output
        response = finish(response, reason, usage_of(reply.body.usage), reply.body.millm)
        await self._keep(response, conversation_items)
        return Reply(reply.report, body=response)

    async def _events(
        self, chunks: AsyncIterator, response: Response, where: list[str | None], items: list[dict]
    ) -> AsyncIterator[Event]:
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
            # stored before the client hears "completed", so it can continue at once
            await self._keep(done, items)
            for event in events:
                yield event
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]  # an async generator: closing it cancels the job

    async def _keep(self, response: Response, items: list[dict]) -> None:
        if response.store:
            await to_thread.run_sync(
                save_response,
                self.store,
                response.model_dump(),
                with_ids(items),
                self.settings.responses_max_stored,
                self.retention_s,
            )

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

    async def input_items(
        self, response_id: str, limit: int, order: str, after: str | None
    ) -> InputItemList:
        """A page of the conversation a stored response answered (earlier turns included)."""
        found = await to_thread.run_sync(load_response, self.store, response_id, self.retention_s)
        if found is None:
            raise not_found(response_id)
        items = found[1] if order == "asc" else list(reversed(found[1]))
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise InvalidRequest(
                    f"after: no input item {after!r} in response {response_id!r}", param="after"
                )
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return InputItemList(
            data=page,
            first_id=page[0]["id"] if page else None,
            last_id=page[-1]["id"] if page else None,
            has_more=len(items) > limit,
        )


def with_ids(items: list[dict]) -> list[dict]:
    """Items as stored: each with an id (OpenAI names input items too), so input_items can page
    by it."""
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
    return [
        item
        if item.get("id")
        else {"id": new_id(prefixes.get(item.get("type", "message"), "item")), **item}
        for item in items
    ]
