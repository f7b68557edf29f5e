"""Each MCP tool against the route it is the twin of, in the OpenAPI document the server serves: the
same parameters with the same bounds, the same body, a schema whose references all resolve."""

import json

import pytest

from millm.server.app import served_openapi
from millm.server.mcp_server import input_schema
from millm.server.mcp_tools import TOOLS
from millm.settings import Settings

OPENAPI = served_openapi(Settings())
BOUNDS = ("type", "minimum", "maximum", "maxLength", "default")


@pytest.mark.parametrize("tool", TOOLS, ids=lambda tool: tool.name)
def test_a_tool_takes_its_routes_parameters_and_body(tool):
    operation = OPENAPI["paths"][tool.path][tool.method]
    route_params = {param["name"]: param for param in operation.get("parameters", [])}
    assert set(route_params) == set(tool.params.model_fields)
    ours = tool.params.model_json_schema()["properties"]
    for name, param in route_params.items():
        theirs, mine = param["schema"], ours[name]
        assert bounds(theirs) == bounds(mine), name
        assert param.get("required", False) == (
            name in tool.params.model_json_schema().get("required", [])
        )
    assert ("requestBody" in operation) == (tool.body is not None)
    schema = input_schema(OPENAPI, tool)
    body = set(tool.body.model_fields) - tool.omit if tool.body is not None else set()
    assert set(schema["properties"]) == set(route_params) | body
    text = json.dumps(schema)
    assert "#/components/" not in text
    for name in {ref.removeprefix("#/$defs/") for ref in _refs(schema)}:
        assert name in schema["$defs"]


def bounds(schema: dict) -> dict:
    # FastAPI leaves out a default of null; pydantic states it.
    return {
        key: schema[key]
        for key in BOUNDS
        if key in schema and not (key == "default" and schema[key] is None)
    }


def _refs(node):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)
