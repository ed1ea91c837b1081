"""The output items and events of remote MCP tools, in OpenAI's shapes (pure).

- `mcp_list_tools`: added with `tools: []`, then `response.mcp_list_tools.in_progress`,
  `.completed` (or `.failed`), then done with the tools (`name`, `description`,
  `input_schema`, `annotations: {read_only}`), or with `error`;
- `mcp_call`: added with `arguments: ""`, `response.mcp_call.in_progress`, the arguments
  (`response.mcp_call_arguments.delta`, `.done`), then, once the server answered,
  `response.mcp_call.completed` (or `.failed`) and done with `output` (or `error`);
- `mcp_approval_request`: added and done at once; the call waits for the client.

A tools/call result (the MCP SDK's `CallToolResult` as plain JSON) becomes the call's
`output` text, or its `error` (`mcp_tool_execution_error` with the server's content,
`mcp_protocol_error`, `http_error`), and `model_text` is what the model is told either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

MakeId = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class ListedTool:
    """One tool an MCP server listed, as the gateway keeps it (and the model sees it)."""

    name: str
    description: str | None
    input_schema: dict[str, Any]
    read_only: bool = False

    def public(self) -> dict[str, Any]:
        """The tool in an `mcp_list_tools` item."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": {"read_only": self.read_only},
        }


def listed_tool(raw: Mapping[str, Any]) -> ListedTool | None:
    """A tool of a tools/list answer (MCP's `Tool`: `inputSchema`, `annotations.readOnlyHint`)
    or of an `mcp_list_tools` item (`input_schema`, `annotations.read_only`); None: no name."""
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return None
    schema = raw.get("inputSchema", raw.get("input_schema"))
    description = raw.get("description")
    notes = raw.get("annotations")
    read_only = False
    if isinstance(notes, Mapping):
        read_only = notes.get("readOnlyHint", notes.get("read_only")) is True
    return ListedTool(
        name,
        description if isinstance(description, str) else None,
        dict(schema) if isinstance(schema, Mapping) else {"type": "object"},
        read_only,
    )


# -- mcp_list_tools ---------------------------------------------------------------------------


def list_item(item_id: str, label: str, tools: Sequence[ListedTool]) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "mcp_list_tools",
        "server_label": label,
        "tools": [t.public() for t in tools],
    }


def list_events(item: dict[str, Any], failed: str | None = None) -> tuple[dict[str, Any], ...]:
    """The item as added (no tools yet), the progress events, the item as done."""
    added = {**item, "tools": []}
    done = dict(item) if failed is None else {**item, "tools": [], "error": failed}
    end = "failed" if failed is not None else "completed"
    return (
        added,
        {"type": "response.mcp_list_tools.in_progress"},
        {"type": f"response.mcp_list_tools.{end}"},
        done,
    )


# -- mcp_call ---------------------------------------------------------------------------------


def call_item(
    item_id: str, label: str, name: str, arguments: str, approval_request_id: str | None = None
) -> dict[str, Any]:
    """An `mcp_call` as added: running, no output yet (its arguments come as events)."""
    return {
        "id": item_id,
        "type": "mcp_call",
        "status": "in_progress",
        "server_label": label,
        "name": name,
        "arguments": arguments,
        "approval_request_id": approval_request_id,
        "error": None,
        "output": None,
    }


def call_started(item: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The call added (arguments empty), in progress, its arguments; then the server runs it."""
    arguments = item["arguments"]
    return (
        {**item, "arguments": ""},
        {"type": "response.mcp_call.in_progress"},
        {"type": "response.mcp_call_arguments.delta", "delta": arguments},
        {"type": "response.mcp_call_arguments.done", "arguments": arguments},
    )


def call_ended(
    item: dict[str, Any], output: str | None, error: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The end event and the call as done, with its output or its error."""
    failed = error is not None
    done = {**item, "status": "failed" if failed else "completed"}
    done["output"], done["error"] = (None, error) if failed else (output, None)
    end = {"type": "response.mcp_call.failed" if failed else "response.mcp_call.completed"}
    return end, done


def approval_item(item_id: str, label: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "mcp_approval_request",
        "server_label": label,
        "name": name,
        "arguments": arguments,
    }


# -- results ----------------------------------------------------------------------------------


def outcome(result: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """A tools/call result's `(output, error)`: its content as text, or (`isError`) the
    server's content as an `mcp_tool_execution_error`."""
    content = result.get("content")
    parts = content if isinstance(content, list) else []
    if result.get("isError") is True:
        return None, {"type": "mcp_tool_execution_error", "content": parts}
    text = "\n".join(t for t in map(part_text, parts) if t)
    structured = result.get("structuredContent")
    if not text and structured is not None:
        text = orjson.dumps(structured).decode()
    return text, None


def protocol_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "mcp_protocol_error", "code": code, "message": message}


def http_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "http_error", "code": status, "message": message}


def part_text(part: Any) -> str:
    """One content part of a result as text: text as it is, the rest as a short note."""
    if not isinstance(part, Mapping):
        return ""
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        return text if isinstance(text, str) else ""
    if kind == "resource":
        resource = part.get("resource")
        if isinstance(resource, Mapping):
            if isinstance(resource.get("text"), str):
                return str(resource["text"])
            return f"[resource: {resource.get('uri')}]"
    if kind == "resource_link":
        return f"[resource: {part.get('uri')}]"
    if kind in ("image", "audio"):
        return f"[{kind}: {part.get('mimeType') or 'data'}]"
    return f"[{kind}]" if isinstance(kind, str) else ""


def model_text(output: str | None, error: Mapping[str, Any] | None) -> str:
    """What the model is told of a call: its output, or what went wrong."""
    if error is None:
        return output or ""
    if error.get("type") == "mcp_tool_execution_error":
        content = error.get("content")
        parts = content if isinstance(content, list) else []
        detail = "\n".join(t for t in map(part_text, parts) if t) or "(no details)"
        return f"Error: the tool failed: {detail}"
    return f"Error: {error.get('message') or 'the call failed'}"


DECLINED = "The user declined to run this tool call."


def declined_text(reason: Any) -> str:
    """What the model is told of a call the client did not approve."""
    if isinstance(reason, str) and reason.strip():
        return f"{DECLINED} Reason: {reason.strip()}"
    return DECLINED
