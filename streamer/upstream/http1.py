"""A lean HTTP/1.1 client on asyncio protocols: one request at a time per kept-alive connection.

Made for the streaming POST to a Chat Completions backend, where a general client (aiohttp's)
costs more per request and per HTTP chunk than the gateway's whole pipeline behind it. The
body is handed over once per socket read, de-chunked in bulk (`http1_wire`), and the idle
timeout is one timer per response, pushed back lazily rather than per read.

- `Connection`: one socket and one request at a time; `http1_pool.ConnectionPool` keeps
  them alive per origin and hands out a `Response` once its head has arrived.
- `Response.read()`: the body bytes that have arrived (b"" at the end). More than
  `HIGH_WATER` unread pauses the socket, so a slow consumer's backpressure reaches the
  server through TCP; the idle timeout does not run while paused.
- `Response.release()` keeps a connection whose body has all arrived; `abort()` cuts it.
- Errors (from `http1_wire`): `ConnectError` (no connection), `ReadTimeout` (a
  `TimeoutError`: no head, or no body bytes, within the idle timeout), `ServerDisconnected`,
  `ProtocolError` (not HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING

from multidict import CIMultiDict

if TYPE_CHECKING:  # the pool owns its connections; a connection only reports back
    from .http1_pool import ConnectionPool

from .http1_wire import (
    MAX_HEAD,
    ChunkedDecoder,
    HTTPClientError,
    ProtocolError,
    ReadTimeout,
    ServerDisconnected,
    body_length,
    parse_head,
)

HIGH_WATER = 32 << 10  # unread body bytes above which the socket is paused
READ_SIZE = 32 << 10  # bytes per socket read at most

_HEAD, _BODY, _DONE = 1, 2, 3  # phases of a response


# -- one connection ---------------------------------------------------------------------


class Response:
    """The answer to one request: status, reason, headers, and its body to `read()`."""

    __slots__ = ("_conn", "content_type", "headers", "reason", "status")

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn
        self.status = conn.status
        self.reason = conn.reason
        self.headers = conn.headers
        self.content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()

    @property
    def complete(self) -> bool:
        """The whole body has arrived (it may still be unread)."""
        conn = self._conn
        return conn is None or conn.phase == _DONE

    @property
    def buffered(self) -> bool:
        """Body bytes have arrived that `read()` returns without waiting."""
        conn = self._conn
        return conn is not None and bool(conn.chunks)

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._conn.transport if self._conn is not None else None

    async def read(self) -> bytes:
        """Every body byte that has arrived and not been read, waiting for some; b"" at the end."""
        conn = self._conn
        if conn is None:
            return b""
        if conn.chunks:
            return conn.take()
        return await conn.wait_body()

    async def read_all(self, limit: int) -> bytes:
        """The body up to `limit` bytes (more is not read)."""
        buf = bytearray()
        while len(buf) < limit:
            data = await self.read()
            if not data:
                break
            buf += data
        return bytes(buf[:limit])

    def release(self) -> None:
        """Done with it: the connection goes back to the pool if the whole body has arrived
        (unread, it is dropped), else it is cut."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pool.release(conn)

    def abort(self) -> None:
        """Cut the connection now (the server sees the disconnect at once)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()


class Connection(asyncio.BufferedProtocol):
    """One TCP (or TLS) connection; parses the response to the request in flight.

    It reads `READ_SIZE` at most per read: a backend that sends a whole long answer at
    once (they do, on loopback) then waits in the kernel's socket buffer instead of this
    process's memory, and each read is a batch that goes out to the client before the
    next is taken. The read buffer is the pool's, shared by its connections: a read is
    copied out of it before the event loop can run another (`buffer_updated` follows
    `get_buffer` at once), so one buffer serves them all.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self._loop = pool._loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.phase = _DONE
        self.reusable = False
        self.got_any = False  # any byte of the current response arrived
        self.chunks: list[bytes] = []
        self.status, self.reason, self.headers = 0, "", CIMultiDict[str]()
        self._head = bytearray()  # a head split over reads
        self._left: int | None = None  # body bytes to come; None: until close; -1: chunked
        self._chunked: ChunkedDecoder | None = None
        self._unread = 0
        self._paused = False
        self._exc: HTTPClientError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timeout = 0.0
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._buffer = pool.read_buffer

    # -- the request ------------------------------------------------------------------

    async def exchange(self, payload: bytes, timeout: float) -> Response:
        """Send one request; return its response once the head has arrived."""
        assert self.transport is not None
        self.phase, self.got_any, self.reusable, self._exc = _HEAD, False, False, None
        self._head.clear()
        self._unread = 0
        self.chunks = []
        self._timeout = timeout
        self.transport.write(payload)
        self._arm()
        while self.phase == _HEAD:
            if self._exc is not None:
                raise self._exc
            await self._wait()
        return Response(self)

    async def wait_body(self) -> bytes:
        while not self.chunks:
            if self._exc is not None:
                raise self._exc
            if self.phase == _DONE:
                return b""
            await self._wait()
        return self.take()

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    @property
    def keepable(self) -> bool:
        """The response ended whole and the connection may carry the next request."""
        return self.phase == _DONE and self.reusable and not self._paused

    def take(self) -> bytes:
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self._unread = 0
        if self._paused and not self.closed:
            self._paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
            self._arm()
        return data

    def abort(self) -> None:
        if self.phase != _DONE and self._exc is None:
            self._exc = ServerDisconnected("the connection was closed by the client")
        if self.transport is not None:
            self.transport.abort()
        self._lost()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._buffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self.got_any = True
        if self._timer is not None:
            self._last = self._loop.time()
        try:
            if self.phase == _BODY:
                self._body(data)
            elif self.phase == _HEAD:
                self._parse_head(data)
            else:  # a server talking out of turn: this connection cannot be trusted
                self.abort()
                return
        except ProtocolError as exc:
            self._exc = exc
            self.abort()
            return
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost tells the reader

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:  # our own abort
            return
        if self.phase == _BODY and self._left is None and exc is None:
            self._done()  # a body delimited by the end of the connection
        elif self.phase != _DONE and self._exc is None:
            where = "in the middle of the response" if self.got_any else "before answering"
            self._exc = ServerDisconnected(f"the server closed the connection {where}")
        self._lost()
        self._wake()

    def _lost(self) -> None:
        if not self.closed:
            self.closed = True
            self.reusable = False
            self._disarm()
            self.pool._forget(self)

    # -- parsing ------------------------------------------------------------------------

    def _parse_head(self, data: bytes) -> None:
        pending = self._head
        if pending:  # accumulate in place: a head trickling in is not copied over and over
            start = max(0, len(pending) - 3)
            pending += data
            if pending.find(b"\r\n\r\n", start) < 0:
                if len(pending) > MAX_HEAD:
                    raise ProtocolError("response head too large")
                return
            data = bytes(pending)
            pending.clear()
        head = data
        while True:
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > MAX_HEAD:
                    raise ProtocolError("response head too large")
                pending += head
                return
            if end > MAX_HEAD:
                raise ProtocolError("response head too large")
            status, reason, headers, http11 = parse_head(head[:end])
            head = head[end + 4 :]
            if status >= 200:
                break
            if status == 101:
                raise ProtocolError("unexpected protocol switch")
            # 1xx: informational, the real head follows
        self.status, self.reason, self.headers = status, reason, headers
        connection = headers.get("Connection", "").lower()
        self.reusable = "close" not in connection and (http11 or "keep-alive" in connection)
        self._left = left = body_length(status, headers)
        if left is None:
            self.reusable = False  # delimited by the close
        if left == -1:
            self._chunked = ChunkedDecoder()
            if "Content-Length" in headers:
                self.reusable = False  # both framings: do not trust what may follow
        else:
            self._chunked = None
        self.phase = _BODY
        if left == 0:
            self._done()
            if head:
                self.abort()
        elif head:
            self._body(head)

    def _body(self, data: bytes) -> None:
        chunked = self._chunked
        if chunked is not None:
            payload = chunked.feed(data)
            if chunked.done:
                self._done()
                if chunked.tail:
                    self.abort()
        elif self._left is None:
            payload = data
        else:
            left = self._left
            payload = data if len(data) <= left else data[:left]
            self._left = left = left - len(payload)
            if not left:
                self._done()
                if len(data) > len(payload):
                    self.abort()
        if payload:
            self.chunks.append(payload)
            self._unread += len(payload)
            if self._unread > HIGH_WATER and self.phase != _DONE and not self._paused:
                self._paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
                self._disarm()  # a paused read is the consumer's doing, not the server's

    def _done(self) -> None:
        self.phase = _DONE
        self._disarm()

    # -- the idle timeout: one timer, moved on lazily ------------------------------------

    def _arm(self) -> None:
        self._last = now = self._loop.time()
        if self._timer is None and self.phase != _DONE and not self.closed:
            self._timer = self._loop.call_at(now + self._timeout, self._on_timer)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self.phase == _DONE or self._paused or self.closed:
            return
        due = self._last + self._timeout
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._on_timer)
            return
        self._exc = ReadTimeout(f"nothing from the server for {self._timeout:g} s")
        self.abort()
