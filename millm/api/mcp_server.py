"""/mcp: millm's own operations as Model Context Protocol tools, over streamable HTTP.

Each tool is the twin of one route, and a thin call into the service, never a second implementation:
- its arguments are the route's path and query parameters and its JSON body's fields, side by side,
  and its input schema is the route's own, taken from the OpenAPI document this app serves;
- it validates them with the route's body model (strict, unknown keys refused, the same cross-field
  rules) and calls the route's service function on the thread the route would use;
- its result is the JSON the route answers; a millm error is a tool error (isError) whose text is
  the route's error body, `{"error": {message, type, param, code}}`, with its HTTP `status` beside it.

Built on the SDK's low-level `Server`, not `MCPServer`: `MCPServer` derives a tool's schema and
validation from a Python signature, in lax mode and ignoring unknown keys, and words its refusals
itself; a route's twin needs the raw arguments, to read them as the route reads its body.

The transport is stateless, with JSON responses (no session, no server-sent stream): every tool
answers in one response, nothing is pushed to clients, and any replica behind a load balancer can
answer any call. The endpoint is an admin route (api/access.py), like every /api route that
changes state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import mcp_types as types
from anyio import to_thread
from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.routing import Route

from millm import __version__
from millm.api.access import MCP_PATH
from millm.api.errors import error_body, validation_error
from millm.api.replies import report_headers
from millm.errors import InvalidRequest, MillmError, NotFound, describe
from millm.protocol.compare import CompareRequest
from millm.protocol.discovery import ContrastRequest, InspectRequest
from millm.protocol.steering import FeatureSetting
from millm.service.facades import Facades

log = logging.getLogger(__name__)

PATH = MCP_PATH
INSTRUCTIONS = (
    "millm serves a language model with sparse-autoencoder (SAE) features attached. Find an SAE with list_saes, "
    "features with search_features, what fires on a text with inspect_text; steer with set_feature (see get_steering), "
    "check the effect with compare; every /v1 request admitted after a change is steered by it."
)
REFS = "#/components/schemas/"


class Params(BaseModel):
    """A tool's path and query parameters; strict, as JSON arguments are typed already."""

    model_config = ConfigDict(strict=True, extra="forbid")


SaeId = Annotated[str, Field(description="An SAE's id (list_saes).")]
Index = Annotated[int, Field(description="A feature's index in the SAE.")]


class NoParams(Params):
    """A tool of a route without parameters."""


class Sae(Params):
    """The SAE a route names in its path."""

    sae_id: SaeId


class Feature(Params):
    """A feature of an SAE, as /api/steering/saes/{sae_id}/features/{index} names it."""

    sae_id: SaeId
    index: Index


# The bounds below are labels.py's Query() bounds, which the route's schema states.
class Search(Params):
    """GET /api/saes/{sae_id}/features."""

    sae_id: SaeId
    q: Annotated[str, Field(max_length=1000)] = ""
    limit: Annotated[int, Field(ge=1, le=1000)] = 50


class FeatureDetail(Params):
    """GET /api/saes/{sae_id}/features/{index}."""

    sae_id: SaeId
    index: Index
    k: Annotated[int, Field(ge=1, le=100)] = 10


class ClearAll(Params):
    """DELETE /api/steering/features."""

    sae_id: Annotated[str | None, Field(description="Clear only this SAE's features (default: every SAE's).")] = None


class Profile(Params):
    """A profile, by name or id."""

    key: Annotated[str, Field(description="The profile's name or id (list_profiles).")]


# A tool's work: (the facades, its parameters, its body or None) -> what the route answers, or a Result.
Call = Callable[[Facades, Any, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Result:
    """An answer with what its route sends as X-miLLM-* headers (they go to the result's _meta)."""

    body: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class Tool:
    """One tool: its name and description, the route it is the twin of, and its call."""

    name: str
    description: str
    method: str
    path: str
    call: Call
    params: type[Params] = NoParams
    body: type[BaseModel] | None = None
    read_only: bool = False
    omit: frozenset[str] = frozenset()  # body fields a tool cannot honour (a stream)


def blocking(function: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """`function(*args)` on a worker thread, as FastAPI runs the plain-function routes that call it."""
    return to_thread.run_sync(partial(function, *args))


async def _list_saes(f: Facades, _: NoParams, __: None) -> dict:
    return {"object": "list", "data": await blocking(f.steering.list_saes)}


async def _search(f: Facades, p: Search, _: None) -> Any:
    return await blocking(f.features.search_features, p.sae_id, p.q, p.limit)


async def _feature(f: Facades, p: FeatureDetail, _: None) -> Any:
    return await f.features.feature_detail(p.sae_id, p.index, p.k)


async def _inspect(f: Facades, p: Sae, body: InspectRequest) -> Any:
    return await f.discovery.inspect(p.sae_id, body)


async def _contrast(f: Facades, p: Sae, body: ContrastRequest) -> Any:
    return await f.discovery.contrast(p.sae_id, body)


async def _steering(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.steering.steering_view)


async def _set_feature(f: Facades, p: Feature, body: FeatureSetting) -> dict:
    return await blocking(lambda: f.steering.set_features({(p.sae_id, p.index): body.checked()}))


async def _clear_feature(f: Facades, p: Feature, _: None) -> dict:
    return await blocking(f.steering.set_features, {(p.sae_id, p.index): None})


async def _clear_steering(f: Facades, p: ClearAll, _: None) -> dict:
    return await blocking(f.steering.set_features, {}, p.sae_id if p.sae_id is not None else True)


async def _profiles(f: Facades, _: NoParams, __: None) -> dict:
    return {"object": "list", "data": await blocking(f.steering.list_profiles)}


async def _activate(f: Facades, p: Profile, _: None) -> dict:
    return await blocking(f.steering.activate_profile, p.key)


async def _deactivate(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.steering.deactivate_profile)


async def _compare(f: Facades, _: NoParams, body: CompareRequest) -> Result:
    # No X-miLLM-Strict header here: fields the comparison ignores are reported, in _meta, as over HTTP.
    reply = await f.discovery.compare(body, strict=False)
    assert reply.body is not None  # stream is not an argument of this tool
    return Result(reply.body.model_dump(), report_headers(reply.report, f.settings.ignored_fields_header_max_bytes))


async def _monitoring_stats(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.monitoring.statistics)


TOOLS = (
    Tool("list_saes", "Every registered SAE: id, model, layer, width, and where it is attached.", "get", "/api/saes", _list_saes, read_only=True),
    Tool("search_features", "An SAE's labelled features ranked by how well their label, top tokens and example match q (BM25; empty q lists all).",
         "get", "/api/saes/{sae_id}/features", _search, Search, read_only=True),
    Tool("get_feature", "One feature: its label, decoder norm, calibration figures and the k features nearest by decoder cosine.",
         "get", "/api/saes/{sae_id}/features/{index}", _feature, FeatureDetail, read_only=True),
    Tool("inspect_text", "The SAE features that fire on a text or conversation (top_k by max, mean or count), and one feature per token.",
         "post", "/api/saes/{sae_id}/inspect", _inspect, Sae, InspectRequest, read_only=True),
    Tool("contrast_texts", "The SAE features that best separate set a from set b of texts: each set's mean, the difference and Cohen's d.",
         "post", "/api/saes/{sae_id}/contrast", _contrast, Sae, ContrastRequest, read_only=True),
    Tool("get_steering", "The live steering state: enabled, version, active profile, and every SAE's features with their op and strength.",
         "get", "/api/steering", _steering, read_only=True),
    Tool("set_feature", "Steer every request from now on: add strength × the feature's decoder row (within ±200; 0 clears), or clamp, cap or ablate it.",
         "put", "/api/steering/saes/{sae_id}/features/{index}", _set_feature, Feature, FeatureSetting),
    Tool("clear_feature", "Stop steering one feature (remove its live value).", "delete", "/api/steering/saes/{sae_id}/features/{index}", _clear_feature, Feature),
    Tool("clear_steering", "Remove every live feature value, or only those of sae_id.", "delete", "/api/steering/features", _clear_steering, ClearAll),
    Tool("list_profiles", "Every saved steering profile, and which one is active.", "get", "/api/profiles", _profiles, read_only=True),
    Tool("activate_profile", "Make a saved profile the steering of every request from now on (checked against the attached SAEs first).",
         "post", "/api/profiles/{key}/activate", _activate, Profile),
    Tool("deactivate_profile", "Deactivate the active profile: the live feature values steer again.", "post", "/api/profiles/deactivate", _deactivate),
    Tool("compare", "Generate one conversation under several steerings side by side (default: unsteered and live), same prompt and seed.",
         "post", "/api/compare", _compare, body=CompareRequest, read_only=True, omit=frozenset({"stream"})),
    Tool("monitoring_stats", "Per-feature monitoring statistics since the last reset: count, mean and max when active, fraction of positions.",
         "get", "/api/monitoring/stats", _monitoring_stats, read_only=True),
)


def describe_tool(openapi: dict, tool: Tool) -> types.Tool:
    """How tools/list presents a tool."""
    hints = types.ToolAnnotations(read_only_hint=tool.read_only, destructive_hint=False, open_world_hint=False)
    return types.Tool(name=tool.name, description=tool.description, input_schema=input_schema(openapi, tool), annotations=hints)


def input_schema(openapi: dict, tool: Tool) -> dict:
    """The route's path and query parameters and its body's fields as one object schema, with the
    components it refers to under $defs."""
    operation = openapi["paths"][tool.path][tool.method]
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in operation.get("parameters", []):
        field = tool.params.model_fields[param["name"]]
        properties[param["name"]] = {**param["schema"], **({"description": field.description} if field.description else {})}
        if param.get("required"):
            required.append(param["name"])
    schema: dict[str, Any] = {"type": "object"}
    if tool.body is not None:
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        component = openapi["components"]["schemas"][ref.removeprefix(REFS)]
        properties |= {name: spec for name, spec in component["properties"].items() if name not in tool.omit}
        required += [name for name in component.get("required", []) if name not in tool.omit]
        schema |= {key: component[key] for key in ("description", "allOf", "oneOf", "anyOf") if key in component}
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
            if isinstance(ref, str) and ref.startswith(REFS) and (name := ref.removeprefix(REFS)) not in found:
                found[name] = components[name]
                pending.append(components[name])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def local_refs(node: Any) -> Any:
    """A copy of `node` whose references to OpenAPI components point into its own $defs."""
    if isinstance(node, dict):
        return {key: "#/$defs/" + value.removeprefix(REFS) if key == "$ref" and str(value).startswith(REFS) else local_refs(value)
                for key, value in node.items()}
    if isinstance(node, list):
        return [local_refs(item) for item in node]
    return node


def parse(model: type[BaseModel], arguments: dict) -> Any:
    """`arguments` read by `model`, or the 400 the route answers for the same body."""
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from None


def bind(tool: Tool, arguments: dict) -> tuple[Params, BaseModel | None]:
    """The tool's parameters and body from its arguments."""
    names = set(tool.params.model_fields)
    omitted = sorted(tool.omit & set(arguments))
    if omitted:
        raise InvalidRequest(f"{omitted[0]}: not an argument of {tool.name} (a tool answers in one piece)", param=omitted[0])
    params = parse(tool.params, {k: v for k, v in arguments.items() if k in names or tool.body is None})
    body = parse(tool.body, {k: v for k, v in arguments.items() if k not in names}) if tool.body is not None else None
    return params, body


def text_result(payload: Any, *, error: bool = False, meta: dict | None = None) -> types.CallToolResult:
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


async def run_tool(service: Facades, tool: Tool, arguments: dict) -> types.CallToolResult:
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
    """The MCP server over the service's facades (the routes' own), its tools' schemas read from `app`'s OpenAPI document."""
    by_name = {tool.name: tool for tool in TOOLS}
    cache: dict[str, list[types.Tool]] = {}

    async def list_tools(_: ServerRequestContext, __: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        if "tools" not in cache:  # on first use: the OpenAPI document takes a moment to build, and every route is in by then
            openapi = await to_thread.run_sync(app.openapi)
            cache.setdefault("tools", [describe_tool(openapi, tool) for tool in TOOLS])
        return types.ListToolsResult(tools=cache["tools"])

    async def call_tool(_: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = by_name.get(params.name)
        if tool is None:
            return error_result(NotFound(f"no tool named {params.name!r}; the tools are {', '.join(by_name)}", param="name", code="tool_not_found"))
        return await run_tool(service, tool, dict(params.arguments or {}))

    server: Server = Server("millm", version=__version__, instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool)
    sessions = StreamableHTTPSessionManager(
        server,
        json_response=True,
        stateless=True,
        # Keys and other sites' pages are refused before this (AccessGuard); bodies are capped by BodyLimit.
        security_settings=None,
        max_request_body_size=service.settings.max_request_bytes,
    )
    # POST only: a stateless server pushes nothing, so it offers no GET stream (the spec's 405), which
    # would otherwise stay open, idle, until the client leaves; DELETE ends sessions it does not keep.
    return McpEndpoint(Route(PATH, StreamableHTTPASGIApp(sessions), methods=["POST"], include_in_schema=False), sessions)
