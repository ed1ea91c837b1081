"""A hostile backend on loopback: raw TCP, so a test can send any bytes at any time.

`RawBackend(handler)` runs `await handler(conn)` for every accepted connection; `conn`
reads requests (`await conn.request()`) and writes whatever the test wants, framed or not.
Nothing here is well-behaved on purpose: that is the test's choice, byte by byte.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson


@dataclass
class RawRequest:
    """One request as it came: the request line, headers (lower-cased names), body."""

    line: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> object:
        return orjson.loads(self.body) if self.body else None


class RawConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def request(self) -> RawRequest | None:
        """The next request on this connection (Content-Length bodies only); None at EOF."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        line, *fields = head.decode("latin-1").split("\r\n")
        headers = {}
        for field in fields:
            if ":" in field:
                name, _, value = field.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        body = await self.reader.readexactly(length) if length else b""
        return RawRequest(line, headers, body)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


Handler = Callable[[RawConnection], Awaitable[None]]


def http_response(
    body: bytes,
    *,
    status: str = "200 OK",
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> bytes:
    """A whole HTTP/1.1 response with a Content-Length body (extra headers verbatim)."""
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def sse_head(headers: dict[str, str] | None = None) -> bytes:
    """The head of a chunked `text/event-stream` answer."""
    lines = ["HTTP/1.1 200 OK", "Content-Type: text/event-stream", "Transfer-Encoding: chunked"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(data: bytes) -> bytes:
    """One HTTP chunk holding `data` (b"" gives the last chunk)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n"


def sse_data(payload: object) -> bytes:
    """`data: <json>` and the blank line, as one chunk of a chunked body."""
    text = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return chunked(b"data: " + text + b"\n\n")


class RawBackend:
    """`async with RawBackend(handler) as backend:` gives `backend.url` (…/v1)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await self.handler(RawConnection(reader, writer))
        finally:
            self._tasks.discard(task)
            writer.close()

    async def __aenter__(self) -> RawBackend:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)
        await self._server.wait_closed()
