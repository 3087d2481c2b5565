"""MkDocs hook: the HTTP API's reference, rendered at build time from the application's own
OpenAPI schema (``create_api(App()).openapi()``), and the dashboard's pages from its router.

mkdocs.yml names this file under ``hooks:``. A page holding the line ``<!-- cronlock:openapi
-->`` gets the operations and schemas there, ``<!-- cronlock:dashboard-routes -->`` the
dashboard's routes. Nothing generated is committed: tests/docs/test_coverage.py builds the site
and checks that every route is on the page.
"""

from __future__ import annotations

import json
from typing import Any

OPENAPI_MARKER = "<!-- cronlock:openapi -->"
DASHBOARD_MARKER = "<!-- cronlock:dashboard-routes -->"
_METHODS = ("get", "post", "put", "patch", "delete")


def _api() -> Any:
    from cronlock import App
    from cronlock.http import create_api

    # A token, so that the schema shows the bearer scheme as a deployed server has it (and
    # the no-token warning stays out of the build's log).
    return create_api(App(), token="docs")


def openapi_schema() -> dict[str, Any]:
    """The OpenAPI schema ``cronlock serve`` publishes at /openapi.json."""
    schema: dict[str, Any] = _api().openapi()
    return schema


def operations(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (METHOD, path) of the schema, in its order."""
    return [
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in _METHODS
        if method in item
    ]


def dashboard_routes() -> list[tuple[str, str]]:
    """Every (METHOD, path) of the dashboard, as mounted by ``create_api`` (``/dashboard``)."""
    from cronlock import App
    from cronlock.http import DASHBOARD_PATH, create_dashboard

    routes = []
    for route in create_dashboard(App(), token="docs").routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            routes.append((method, DASHBOARD_PATH + route.path))  # type: ignore[attr-defined]
    return routes


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type(schema: dict[str, Any]) -> str:
    """A short readable type: ``string (uuid)``, ``array of JobStatus``, ``integer | null``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    if "anyOf" in schema:
        return " \\| ".join(_type(part) for part in schema["anyOf"])
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _type(schema["allOf"][0])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    text = str(kind or "any")
    if "format" in schema:
        text += f" ({schema['format']})"
    return text


def _limits(schema: dict[str, Any]) -> str:
    parts = []
    for key, label in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
    ):
        for candidate in [schema, *schema.get("anyOf", [])]:
            if key in candidate:
                parts.append(f"{label} {candidate[key]}")
    if "default" in schema:
        parts.append(f"default `{json.dumps(schema['default'])}`")
    return ", ".join(parts)


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    lines = [f"### {method} {path}", ""]
    if operation.get("summary"):
        lines += [f"**{operation['summary']}.**", ""]
    if operation.get("description"):
        lines += [operation["description"].strip(), ""]
    lines += [
        "Authentication: "
        + ("bearer token" if operation.get("security") else "none (a public surface)"),
        "",
    ]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += [
            "| Parameter | In | Type | Required | Description |",
            "|---|---|---|---|---|",
        ]
        for parameter in parameters:
            schema = parameter.get("schema", {})
            description = parameter.get("description") or schema.get("description") or ""
            limits = _limits(schema)
            if limits:
                description = f"{description} ({limits})" if description else limits
            lines.append(
                f"| `{parameter['name']}` | {parameter['in']} | {_type(schema)} | "
                f"{'yes' if parameter.get('required') else 'no'} | {_escape(description)} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body ({media}): {_type(content.get('schema', {}))}", ""]
    lines += ["| Status | Description | Body |", "|---|---|---|"]
    for status, response in operation.get("responses", {}).items():
        bodies = [
            f"{_type(content['schema'])}" if content.get("schema") else f"`{media}`"
            for media, content in response.get("content", {}).items()
        ]
        lines.append(
            f"| {status} | {_escape(response.get('description', ''))} | {', '.join(bodies)} |"
        )
    return [*lines, ""]


def _component(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#schema-{name.lower()}}}", ""]
    if schema.get("description"):
        lines += [_escape(schema["description"]), ""]
    if "enum" in schema:
        return [*lines, "One of: " + ", ".join(f"`{value}`" for value in schema["enum"]), ""]
    required = set(schema.get("required", []))
    properties = schema.get("properties", {})
    if properties:
        lines += ["| Field | Type | Required | Description |", "|---|---|---|---|"]
        for field, spec in properties.items():
            description = spec.get("description", "")
            limits = _limits(spec)
            if limits:
                description = f"{description} ({limits})" if description else limits
            lines.append(
                f"| `{field}` | {_type(spec)} | {'yes' if field in required else 'no'} | "
                f"{_escape(description)} |"
            )
        lines.append("")
    return lines


def render_openapi(schema: dict[str, Any] | None = None) -> str:
    """The Markdown of every operation, then every schema they use."""
    schema = schema or openapi_schema()
    lines = ["## Endpoints", ""]
    for method, path in operations(schema):
        lines += _operation(method, path, schema["paths"][path][method.lower()])
    lines += ["## Schemas", ""]
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        lines += _component(name, component)
    return "\n".join(lines)


def render_dashboard_routes() -> str:
    lines = ["| Method | Path |", "|---|---|"]
    lines += [f"| {method} | `{path}` |" for method, path in dashboard_routes()]
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs' hook: the markers replaced by what they stand for."""
    if OPENAPI_MARKER in markdown:
        markdown = markdown.replace(OPENAPI_MARKER, render_openapi())
    if DASHBOARD_MARKER in markdown:
        markdown = markdown.replace(DASHBOARD_MARKER, render_dashboard_routes())
    return markdown
