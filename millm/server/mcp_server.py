"""/mcp: millm's own operations as Model Context Protocol tools, over streamable HTTP.

Each tool is the twin of one route, and a thin call into the service, never a second implementation:
- its arguments are the route's path and query parameters and its JSON body's fields, side by side,
  and its input schema is the route's own, taken from the OpenAPI document this app serves;
- it validates them with the route's body model (strict, unknown keys refused, the same cross-field
  rules) and calls the route's service function on the thread the route would use;
- its result is the JSON the route answers; a millm error is a tool error (isError) whose text is
  the route's error body, `{"error": {message, type, param, code}}`, with its HTTP `status` beside
  it.

Built on the SDK's low-level `Server`, not `MCPServer`: `MCPServer` derives a tool's schema and
validation from a Python signature, in lax mode and ignoring unknown keys, and words its refusals
itself; a route's twin needs the raw arguments, to read them as the route reads its body.

The transport is stateless, with JSON responses (no session, no server-sent stream): every tool
answers in one response, nothing is pushed to clients, and any replica behind a load balancer can
answer any call. The endpoint is an admin route (server/access.py), like every /api route that
changes state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from anyio import to_thread
from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from pydantic import BaseModel, ValidationError
from starlette.routing import Route

from millm import __version__
from millm.errors import InvalidRequest, MillmError, NotFound, describe
from millm.server.access import MCP_PATH
from millm.server.facades import Facades
from millm.server.mcp_params import Params
from millm.server.mcp_tools import TOOLS, McpTool, Result
from millm.v1.http.errors import error_body, validation_error

log = logging.getLogger(__name__)

PATH = MCP_PATH
INSTRUCTIONS = (
    "millm serves a language model with sparse-autoencoder (SAE) features attached. Find an SAE "
    "with list_saes, features with search_features, what fires on a text with inspect_text; steer "
    "with set_feature (see get_steering), check the effect with compare; every /v1 request "
    "admitted after a change is steered by it."
)
REFS = "#/components/schemas/"


def describe_tool(openapi: dict, tool: McpTool) -> types.Tool:
    """How tools/list presents a tool."""
    hints = types.ToolAnnotations(
        read_only_hint=tool.read_only, destructive_hint=False, open_world_hint=False
    )
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=input_schema(openapi, tool),
        annotations=hints,
    )


def input_schema(openapi: dict, tool: McpTool) -> dict:
    """The route's path and query parameters and its body's fields as one object schema, with the
    components it refers to under $defs."""
    operation = openapi["paths"][tool.path][tool.method]
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in operation.get("parameters", []):
        field = tool.params.model_fields[param["name"]]
        properties[param["name"]] = {
            **param["schema"],
            **({"description": field.description} if field.description else {}),
        }
        if param.get("required"):
            required.append(param["name"])
    schema: dict[str, Any] = {"type": "object"}
    if tool.body is not None:
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        component = openapi["components"]["schemas"][ref.removeprefix(REFS)]
        properties |= {
            name: spec for name, spec in component["properties"].items() if name not in tool.omit
        }
        required += [name for name in component.get("required", []) if name not in tool.omit]
        schema |= {
            key: component[key]
            for key in ("description", "allOf", "oneOf", "anyOf")
            if key in component
        }
    schema |= {"properties": properties, "required": required, "additionalProperties": False}
    defs = referenced(openapi["components"]["schemas"], schema)
    if defs:
        schema["$defs"] = defs
    return local_refs(schema)


def referenced(components: dict, schema: Any) -> dict:
    """Every component `schema` refers to, directly or through others."""
    found: dict[str, Any] = {}
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if (
                isinstance(ref, str)
                and ref.startswith(REFS)
                and (name := ref.removeprefix(REFS)) not in found
            ):
                found[name] = components[name]
                pending.append(components[name])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def local_refs(node: Any) -> Any:
    """A copy of `node` whose references to OpenAPI components point into its own $defs."""
    if isinstance(node, dict):
        return {
            key: "#/$defs/" + value.removeprefix(REFS)
            if key == "$ref" and str(value).startswith(REFS)
            else local_refs(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [local_refs(item) for item in node]
    return node


def parse(model: type[BaseModel], arguments: dict) -> Any:
    """`arguments` read by `model`, or the 400 the route answers for the same body."""
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from None


def bind(tool: McpTool, arguments: dict) -> tuple[Params, BaseModel | None]:
    """The tool's parameters and body from its arguments."""
    names = set(tool.params.model_fields)
    omitted = sorted(tool.omit & set(arguments))
    if omitted:
        raise InvalidRequest(
            f"{omitted[0]}: not an argument of {tool.name} (a tool answers in one piece)",
            param=omitted[0],
        )
    params = parse(
        tool.params, {k: v for k, v in arguments.items() if k in names or tool.body is None}
    )
    body = (
        parse(tool.body, {k: v for k, v in arguments.items() if k not in names})
        if tool.body is not None
        else None
    )
    return params, body


def text_result(
    payload: Any, *, error: bool = False, meta: dict | None = None
) -> types.CallToolResult:
    """A tool result carrying `payload` as JSON text, and as structured content."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
        structured_content=payload,
        is_error=error,
        meta=meta,
    )


def error_result(error: MillmError) -> types.CallToolResult:
    """The route's error body, and the status it would answer with."""
    return text_result({**error_body(error), "status": error.status}, error=True)


async def run_tool(service: Facades, tool: McpTool, arguments: dict) -> types.CallToolResult:
    """Call one tool; every failure, expected or not, is a tool error in the route's shape."""
    try:
        # The SDK serves calls on its own tasks, outside the HTTP request's scope: this call's
        # model leases are its own, returned when it ends.
        with service.requests.request_scope():
            params, body = bind(tool, arguments)
            answer = await tool.call(service, params, body)
    except MillmError as exc:
        return error_result(exc)
    except Exception as exc:  # the HTTP error handler's last resort, as a tool error
        log.exception("tool %s failed", tool.name)
        return error_result(MillmError(f"internal error: {describe(exc)}"))
    if isinstance(answer, Result):
        return text_result(jsonable_encoder(answer.body), meta=answer.headers)
    return text_result(jsonable_encoder(answer))


@dataclass
class McpEndpoint:
    """The route serving /mcp, and the session manager whose run() the app's lifespan holds open."""

    route: Route
    sessions: StreamableHTTPSessionManager


def build_mcp(service: Facades, app: FastAPI) -> McpEndpoint:
    """The MCP server over the service's facades (the routes' own), its tools' schemas read from
    `app`'s OpenAPI document."""
    by_name = {tool.name: tool for tool in TOOLS}
    cache: dict[str, list[types.Tool]] = {}

    async def list_tools(
        _: ServerRequestContext, __: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        # On first use: the OpenAPI document takes a moment to build, and every route is in by then.
        if "tools" not in cache:
            openapi = await to_thread.run_sync(app.openapi)
            cache.setdefault("tools", [describe_tool(openapi, tool) for tool in TOOLS])
        return types.ListToolsResult(tools=cache["tools"])

    async def call_tool(
        _: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = by_name.get(params.name)
        if tool is None:
            return error_result(
                NotFound(
                    f"no tool named {params.name!r}; the tools are {', '.join(by_name)}",
                    param="name",
                    code="tool_not_found",
                )
            )
        return await run_tool(service, tool, dict(params.arguments or {}))

    server: Server = Server(
        "millm",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    sessions = StreamableHTTPSessionManager(
        server,
        json_response=True,
        stateless=True,
        # Keys and other sites' pages are refused before this (AccessGuard); bodies are capped by
        # BodyLimit.
        security_settings=None,
        max_request_body_size=service.settings.max_request_bytes,
    )
    # POST only: a stateless server pushes nothing, so it offers no GET stream (the spec's 405),
    # which would otherwise stay open, idle, until the client leaves; DELETE ends sessions it does
    # not keep.
    return McpEndpoint(
        Route(PATH, StreamableHTTPASGIApp(sessions), methods=["POST"], include_in_schema=False),
        sessions,
    )
