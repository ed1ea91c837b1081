"""The Response's echo of the request's tools and text format, normalised as OpenAI does (pure).

OpenAI echoes a function tool with `description`, `parameters` and `strict` always
present (`strict` true unless the client turned it off) and a `json_schema` text format
with `description` and `strict` present. Namespace trees, `custom`, `tool_search` and
hosted tools are OpenAI extensions the Open Responses spec does not define: they are
echoed as sent, a namespace's function children normalised like top-level functions.
Unknown fields pass through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamer.core.mcp_servers import public


def echo_function(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A function tool as the Response shows it: the three optional fields present."""
    out = dict(tool)
    out.setdefault("description", None)
    out.setdefault("parameters", None)
    if out.get("strict") is None:
        out["strict"] = True
    return out


def echo_tool(tool: Any) -> Any:
    if not isinstance(tool, Mapping):
        return tool
    kind = tool.get("type")
    if kind == "function":
        return echo_function(tool)
    if kind == "mcp":  # headers null, no authorization, the URL's path hidden (OpenAI's echo)
        return public(tool)
    if kind == "namespace" and isinstance(tool.get("tools"), list):
        # OpenAI requires a namespace's string description; the gateway ignores one that
        # is missing or not a string (tool_decls.py), and the echo shows it empty
        children = [echo_tool(child) for child in tool["tools"]]
        description = tool.get("description")
        description = description if isinstance(description, str) else ""
        return {**tool, "description": description, "tools": children}
    return tool


def echo_tools(tools: Any) -> list[Any]:
    return [echo_tool(tool) for tool in tools or ()]


def echo_text(text: Any) -> dict[str, Any]:
    """`text` with its format (`{"type":"text"}` by default) and verbosity (`medium`)."""
    text = text if isinstance(text, Mapping) else {}
    fmt = text.get("format") or {"type": "text"}
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        fmt = dict(fmt)
        fmt.setdefault("description", None)
        if fmt.get("strict") is None:
            fmt["strict"] = False
    return {**text, "format": fmt, "verbosity": text.get("verbosity") or "medium"}
