"""A tiny stdio MCP server for the Codex CLI tests (standard library only).

It offers one tool, `echo_marker(text)`, which answers with a marker string containing its
argument and appends one JSON line per call to the file named by `MCP_PROBE_LOG`, so a test
can prove the tool really ran (rather than the model merely claiming it did).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MARKER = "PROBE-MARKER"
TOOL = {
    "name": "echo_marker",
    "description": "Echo the given text back wrapped in a marker string.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "Text to echo."}},
        "required": ["text"],
        "additionalProperties": False,
    },
}


def marker_for(text: str) -> str:
    return f"{MARKER}:{text}"


def _log_call(arguments: dict[str, Any]) -> None:
    path = os.environ.get("MCP_PROBE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": "echo_marker", "arguments": arguments}) + "\n")


def _handle(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        return {
            # Echo the client's version: this server uses nothing version-specific.
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "probe", "version": "1.0.0"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        if params.get("name") != TOOL["name"]:
            raise LookupError(f"unknown tool {params.get('name')!r}")
        arguments = params.get("arguments") or {}
        _log_call(arguments)
        text = marker_for(str(arguments.get("text", "")))
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    raise NotImplementedError(method)


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            _send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse"}})
            continue
        if "id" not in message:
            continue  # notifications (notifications/initialized, cancelled) need no answer
        try:
            result = _handle(message.get("method", ""), message.get("params") or {})
        except NotImplementedError as e:
            error = {"code": -32601, "message": f"method not found: {e}"}
            _send({"jsonrpc": "2.0", "id": message["id"], "error": error})
        except LookupError as e:
            _send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "error": {"code": -32602, "message": str(e)},
                }
            )
        else:
            _send({"jsonrpc": "2.0", "id": message["id"], "result": result})


if __name__ == "__main__":
    main()
