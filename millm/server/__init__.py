"""The HTTP shell: the app, access keys, body caps, the served OpenAPI schema, the MCP server,
the workbench's files, health and jobs; composition.py makes every part once and facades.py
hands each route its capability's service."""
