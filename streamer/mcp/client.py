"""The gateway's MCP client: list a server's tools (cached) and call one, on the `mcp` SDK.

Each operation opens its own session (streamable HTTP; HTTP+SSE for a URL whose path ends
in `/sse`), initialises it, does the one request and closes it, all within `--mcp-timeout`.
Every TCP connection goes through the `--mcp-allow` guard (guard.py), after DNS. A server's
`headers` go on its session's HTTP client only; no message here carries them or the URL's
path. Tool lists are cached per server URL and headers (`McpServer.key`: a digest) for
`--mcp-cache-seconds`, `--mcp-cache-entries` at most, the oldest out first.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from streamer import tracing
from streamer.core.mcp_hosts import Blocked, HostRule
from streamer.core.mcp_items import ListedTool, http_error, listed_tool, outcome, protocol_error
from streamer.core.mcp_servers import McpServer

if TYPE_CHECKING:  # the SDK (~400 modules) and its HTTP stack (httpx2, httpcore2, anyio:
    # ~6 MB of an idle gateway's RSS) are imported by the first MCP turn, not by serve
    import httpx2
    from mcp.client.session import ClientSession

log = logging.getLogger("streamer.mcp")


class McpUnavailable(Exception):
    """A server whose tools could not be listed: why (no header, no URL path in it)."""


@dataclass(frozen=True, slots=True)
class McpSettings:
    """The operator's MCP settings (`--mcp-*`)."""

    rule: HostRule = field(default_factory=HostRule)
    timeout: float = 30.0
    max_tools: int = 128
    max_list_bytes: int = 1024 * 1024
    max_output_bytes: int = 1024 * 1024
    cache_seconds: float = 300.0
    cache_entries: int = 256


@dataclass(frozen=True, slots=True)
class _Listed:
    expires: float
    tools: tuple[ListedTool, ...]
    size: int  # the list's JSON bytes, as the server sent it


class McpClients:
    """One per gateway: the host rule, the bounds and the tool-list cache."""

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings
        self._cache: OrderedDict[str, _Listed] = OrderedDict()
        self._context: ssl.SSLContext | None = None

    @property
    def _tls(self) -> ssl.SSLContext:
        """Made once, by the first MCP turn: loading the CAs costs ms (and memory)."""
        if self._context is None:
            self._context = ssl.create_default_context()
        return self._context

    @property
    def cached_bytes(self) -> int:
        """The JSON bytes of the cached tool lists (what the cache holds, roughly)."""
        return sum(entry.size for entry in self._cache.values())

    async def list_tools(self, server: McpServer) -> tuple[ListedTool, ...]:
        """The server's tools (cached), or `McpUnavailable` saying why."""
        key, now = server.key, time.monotonic()
        entry = self._cache.get(key)
        if entry is not None and entry.expires > now:
            self._cache.move_to_end(key)
            return entry.tools
        try:
            with tracing.span("mcp list_tools", {"streamer.mcp.server_label": server.label}):
                async with asyncio.timeout(self.settings.timeout), self._session(server) as s:
                    result = await s.list_tools()
        except Exception as exc:
            raise McpUnavailable(self._why(exc)) from None
        raw = result.model_dump(mode="json", by_alias=True, exclude_none=True).get("tools", [])
        size = len(orjson.dumps(raw))
        if len(raw) > self.settings.max_tools or size > self.settings.max_list_bytes:
            raise McpUnavailable(
                f"It listed {len(raw)} tools in {size} bytes: more than this gateway takes "
                f"(--mcp-max-tools {self.settings.max_tools}, "
                f"--mcp-max-list-bytes {self.settings.max_list_bytes})."
            )
        tools = tuple(t for t in map(listed_tool, raw) if t is not None)
        self._remember(key, _Listed(now + self.settings.cache_seconds, tools, size))
        return tools

    def _remember(self, key: str, entry: _Listed) -> None:
        self._cache[key] = entry
        self._cache.move_to_end(key)
        while len(self._cache) > self.settings.cache_entries:
            self._cache.popitem(last=False)

    async def call_tool(
        self, server: McpServer, name: str, arguments: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any] | None]:
        """Run tools/call: `(output, error)` in the `mcp_call` item's terms."""
        from mcp.shared.exceptions import MCPError

        try:
            with tracing.tool_call(server.label, name):
                async with asyncio.timeout(self.settings.timeout), self._session(server) as s:
                    result = await s.call_tool(name, arguments)
        except MCPError as exc:
            return None, protocol_error(exc.error.code, exc.error.message[:1000])
        except Exception as exc:
            return None, http_error(_status(exc), self._why(exc))
        output, error = outcome(result.model_dump(mode="json", by_alias=True, exclude_none=True))
        limit = self.settings.max_output_bytes
        if output is not None and len(output.encode()) > limit:
            message = f"The tool's output is larger than --mcp-max-output-bytes ({limit})."
            return None, http_error(413, message)
        return output, error

    @asynccontextmanager
    async def _session(self, server: McpServer) -> AsyncIterator[ClientSession]:
        """One initialised SDK session with the server (streamable HTTP, or HTTP+SSE)."""
        import httpx2
        from mcp.client.session import ClientSession
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        # the operation's span (tracing.tool_call) continues at the server
        headers = {**tracing.outgoing_headers(), **dict(server.headers)}
        timeout = httpx2.Timeout(self.settings.timeout)
        event_size = max(self.settings.max_list_bytes, self.settings.max_output_bytes) * 2
        if urlsplit(server.url).path.rstrip("/").endswith("/sse"):
            streams = sse_client(
                server.url,
                headers=headers,
                timeout=self.settings.timeout,
                sse_read_timeout=self.settings.timeout,
                httpx_client_factory=self._http_client,
            )
            async with streams as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                yield session
            return
        async with self._http_client(headers, timeout) as http:
            streams = streamable_http_client(
                server.url, http_client=http, max_sse_event_size=event_size
            )
            async with streams as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                yield session

    def _http_client(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        """An HTTP client for one session: its headers, every connection guarded."""
        import httpcore2
        import httpx2

        from streamer.mcp.guard import GuardedBackend

        transport = httpx2.AsyncHTTPTransport(verify=self._tls, trust_env=False)
        # httpx2's transport takes no network backend: its pool is made again with the guard
        transport._pool = httpcore2.AsyncConnectionPool(
            ssl_context=self._tls, network_backend=GuardedBackend(self.settings.rule)
        )
        return httpx2.AsyncClient(
            headers=headers,
            timeout=timeout or httpx2.Timeout(self.settings.timeout),
            transport=transport,
            trust_env=False,
            follow_redirects=False,
        )

    def _why(self, exc: BaseException) -> str:
        """What went wrong, in words that carry no header and no URL path."""
        import httpx2
        from mcp.shared.exceptions import MCPError

        exc = _leaf(exc)
        if isinstance(exc, TimeoutError):
            return f"It did not answer within --mcp-timeout ({self.settings.timeout:g} s)."
        if isinstance(exc, Blocked):
            return f"The gateway may not reach it: {exc}."
        if isinstance(exc, httpx2.HTTPStatusError):
            return f"It answered HTTP {exc.response.status_code}."
        if isinstance(exc, MCPError):
            return f"It answered an MCP error {exc.error.code}: {exc.error.message[:300]}"
        if isinstance(exc, (httpx2.TransportError, OSError)):
            return f"It could not be reached ({type(exc).__name__})."
        log.info("MCP operation failed", exc_info=exc)
        return f"The MCP session failed ({type(exc).__name__})."


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's task-group exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _status(exc: BaseException) -> int:
    import httpx2

    exc = _leaf(exc)
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code
    if isinstance(exc, TimeoutError):
        return 504
    return 502
