"""A lean HTTP/1.1 streaming client for the load client: one kept-alive connection, one
request at a time, the body handed over once per socket read (chunked framing removed).

A general client (aiohttp's) spends most of its time per HTTP chunk, and the raw relay sends
one chunk per SSE event: with it the client, not the target, set the pace. Here the chunk
framing costs a find and an int per chunk, and everything else is done once per read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlsplit

from httpwire import set_nodelay


class HttpStatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def build_request(url: str, body: bytes, headers: dict[str, str]) -> tuple[str, int, bytes]:
    """(host, port, the request bytes) for a POST of `body` to `url`."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {host}:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class StreamConnection(asyncio.Protocol):
    """Call `request()`; `on_body(data)` gets the de-chunked body once per socket read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.on_body: Callable[[bytes], None] = lambda data: None
        self.closed = False
        self._head = bytearray()
        self._in_body = False
        self._chunked = False
        self._left = 0  # body bytes left: of the current chunk, or of a Content-Length body
        self._skip = 0  # CRLF bytes to skip after a chunk's data
        self._last = False  # the zero-size chunk was seen
        self._size_line = bytearray()
        self._close_after = False
        self._status = 0

    @classmethod
    async def open(cls, host: str, port: int) -> StreamConnection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(cls, host, port)
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        set_nodelay(transport)

    async def request(self, payload: bytes, on_body: Callable[[bytes], None]) -> None:
        """Send one request and return when its response has ended (HttpStatusError if not
        200: its body is read and dropped first)."""
        assert self.transport is not None and not self.closed
        self.on_body = on_body
        self._head.clear()
        self._in_body = self._last = False
        self._left = self._skip = 0
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        await self.done
        if self._close_after:
            self.close()
        if self._status != 200:
            raise HttpStatusError(self._status)

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            return  # nothing asked for: a server talking out of turn is ignored
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            self._start_body(bytes(self._head[:end]))
            data = bytes(self._head[end + 4 :])
            self._head.clear()
            if not data and not self.done.done() and not self._chunked and self._left == 0:
                self.done.set_result(None)  # an empty Content-Length body
                return
        if self._chunked:
            self._feed_chunked(data)
        elif self._left >= 0:
            take = data[: self._left]
            self._left -= len(take)
            if take:
                self._deliver(take)
            if self._left == 0:
                self.done.set_result(None)
        elif data:
            self._deliver(data)  # delimited by the connection's end

    def _start_body(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self._status = int(lines[0].split(b" ", 2)[1])
        self._chunked, self._left, self._close_after = False, -1, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                self._chunked = True
            elif name == b"content-length":
                self._left = int(value)
            elif name == b"connection" and value == b"close":
                self._close_after = True
        if self._chunked:
            self._left = 0
        self._in_body = True

    def _deliver(self, data: bytes) -> None:
        if self._status == 200:
            self.on_body(data)

    def _feed_chunked(self, data: bytes) -> None:
        if self._size_line:
            data = bytes(self._size_line) + data
            self._size_line.clear()
        pieces: list[bytes] = []
        append = pieces.append
        pos, n = 0, len(data)
        if self._left:  # the rest of a chunk that the previous read cut
            take = min(self._left, n)
            append(data[:take])
            pos, self._left = take, self._left - take
            if not self._left:
                self._skip = 2
        if self._skip and pos < n:
            k = min(self._skip, n - pos)
            pos, self._skip = pos + k, self._skip - k
        if not self._left and not self._skip and not self._last:
            find = data.find
            while pos < n:  # the hot loop: one find, one int, one slice per chunk
                eol = find(b"\r\n", pos)
                if eol < 0:
                    self._size_line += data[pos:]
                    break
                try:
                    size = int(data[pos:eol], 16)
                except ValueError:  # a chunk extension
                    size = int(data[pos:eol].split(b";", 1)[0], 16)
                start = eol + 2
                if size == 0:  # the last chunk; no trailers from the servers we measure
                    self._last, self._skip = True, 2 - min(2, n - start)
                    break
                end = start + size
                append(data[start:end])
                if end + 2 <= n:
                    pos = end + 2
                    continue
                self._left = max(0, end - n)
                if not self._left:
                    self._skip = 2 - (n - end)
                break
        if pieces:
            self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        if self._last and not self._skip and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            if self._in_body and not self._chunked and self._left < 0:
                self.done.set_result(None)  # the body was delimited by the close
            else:
                self.done.set_exception(ConnectionError("connection closed mid-response"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
