"""POST /v1/responses (a body its model has checked), and GET / DELETE of stored responses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from millm.v1.http.deps import part
from millm.v1.http.json_body import JsonRoute
from millm.v1.responses.protocol import DeletedResponse, InputItemList, Response, ResponsesRequest
from millm.v1.responses.serving import ResponsesApi
from millm.v1.serving.http_replies import event_frames, respond, unless_client_leaves
from millm.v1.serving.routes import ignored_cap, strict

router = APIRouter(route_class=JsonRoute)
STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The response object; with stream: true, the Responses event sequence "
        "(response.created ... response.completed)",
        "content": {"text/event-stream": {}},
    }
}


@router.post(
    "/v1/responses",
    summary="OpenAI Responses API: a response to input items (streaming and non-streaming)",
    response_model=Response,
    responses=STREAM_RESPONSE,
)
async def create_response(body: ResponsesRequest, request: Request):
    """Answer the input (continuing previous_response_id's conversation) as chat completions
    would, steered alike."""
    reply = await unless_client_leaves(
        request, part(request, ResponsesApi).create(body, strict(request))
    )
    return respond(reply, ignored_cap(request), framing=event_frames)


@router.get("/v1/responses/{response_id}", summary="A stored response")
async def get_response(response_id: str, request: Request) -> dict:
    """The response object as it was when it finished (404 once deleted or past the retention)."""
    return await part(request, ResponsesApi).get(response_id)


@router.delete("/v1/responses/{response_id}", summary="Delete a stored response")
async def delete_response(response_id: str, request: Request) -> DeletedResponse:
    """Forget a stored response; previous_response_id can no longer name it."""
    return await part(request, ResponsesApi).delete(response_id)


@router.get(
    "/v1/responses/{response_id}/input_items", summary="The conversation a stored response answered"
)
async def input_items(
    response_id: str,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> InputItemList:
    """Its input items, earlier turns of previous_response_id included, newest first unless
    order=asc."""
    return await part(request, ResponsesApi).input_items(response_id, limit, order, after)
