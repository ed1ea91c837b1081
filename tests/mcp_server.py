"""A real MCP server for the tests, on the `mcp` SDK, run in its own process.

`python tests/mcp_server.py [--token T] [--sse]` serves streamable HTTP at `/mcp` (or
HTTP+SSE at `/sse` with `--sse`) on a free loopback port and prints `MCP READY <port>` once
it listens. Its tools: `lookup` (text, read-only), `spell` (the same, its argument short), `weather` (structured content), `broken`
(a tool error), `stuck` (never answers), `count` (how many calls this process ran).
With `--token`, every request without `Authorization: Bearer T` is a 401; with `--trace-id`,
every request without a `traceparent` of that trace.
"""

from __future__ import annotations

import argparse
import socket
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field
from starlette.types import ASGIApp, Receive, Scope, Send

CALLS = {"n": 0}
server = MCPServer("streamer-test")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def lookup(term: str) -> str:
    """Look a term up in the test dictionary."""
    CALLS["n"] += 1
    return f"{term}: a word the test server knows"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def spell(q: Annotated[str, Field(max_length=6)]) -> str:
    """Spell a short word (its schema bounds it: a random model's strings run long)."""
    CALLS["n"] += 1
    return f"{q}: a word the test server knows"


@server.tool(structured_output=True)
def weather(city: str) -> dict[str, Any]:
    """The weather in a city (structured)."""
    CALLS["n"] += 1
    return {"city": city, "celsius": 21}


@server.tool()
def broken(reason: str = "broken on purpose") -> str:
    """Always fails."""
    CALLS["n"] += 1
    raise ToolError(reason)


@server.tool()
async def stuck() -> str:
    """Never answers (for the gateway's --mcp-timeout)."""
    await anyio.Event().wait()
    return "never"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def count() -> str:
    """How many tool calls this server ran."""
    return str(CALLS["n"])


class RequireToken:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != (
            self.expected
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await self.app(scope, receive, send)


class RequireTrace:
    """Every request must carry a W3C `traceparent` of this trace (the gateway's span)."""

    def __init__(self, app: ASGIApp, trace_id: str) -> None:
        self.app, self.trace_id = app, trace_id.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parent = (
            dict(scope["headers"]).get(b"traceparent", b"") if scope["type"] == "http" else None
        )
        if parent is not None and parent.split(b"-")[1:2] != [self.trace_id]:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no traceparent of the trace"})
            return
        await self.app(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token")
    parser.add_argument("--sse", action="store_true")
    parser.add_argument("--trace-id")
    args = parser.parse_args()
    app: ASGIApp = server.sse_app() if args.sse else server.streamable_http_app()
    if args.token:
        app = RequireToken(app, args.token)
    if args.trace_id:
        app = RequireTrace(app, args.trace_id)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    srv = uvicorn.Server(config)
    sock.listen(64)
    print(f"MCP READY {port}", flush=True)  # it listens: connections queue until uvicorn runs
    srv.run(sockets=[sock])


if __name__ == "__main__":
    main()
