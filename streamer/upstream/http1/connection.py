"""A lean HTTP/1.1 client on asyncio protocols: one request at a time per kept-alive connection.

Made for the streaming POST to a Chat Completions backend, where a general client (aiohttp's)
costs more per request and per HTTP chunk than the gateway's whole pipeline behind it. The
body is handed over once per socket read, de-chunked in bulk (`http1_wire`), and the idle
timeout is one timer per response, pushed back lazily rather than per read. What the bytes
mean (framing, the end of a response, whether the connection can be kept) is decided by the
sans-I/O `http1_parser.ResponseParser`; `Connection` only feeds it and acts on its events.

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
from typing import Protocol

from streamer.upstream.http1.parser import BODY, BROKEN, DONE, END, HEAD, Head, ResponseParser
from streamer.upstream.http1.wire import (
    HTTPClientError,
    ProtocolError,
    ReadTimeout,
    ServerDisconnected,
)

HIGH_WATER = 32 << 10  # unread body bytes above which the socket is paused
READ_SIZE = 32 << 10  # bytes per socket read at most


# -- one connection ---------------------------------------------------------------------


Payload = bytes | list[bytes]
"""A request as sent: its bytes, or its pieces (a long body's kept blobs: one vectored
write, never joined into one buffer)."""


class Response:
    """The answer to one request: status, reason, headers, and its body to `read()`."""

    __slots__ = ("_conn", "content_type", "headers", "reason", "status")

    def __init__(self, conn: Connection, head: Head) -> None:
        self._conn: Connection | None = conn
        self.status = head.status
        self.reason = head.reason
        self.headers = head.headers
        self.content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()

    @property
    def complete(self) -> bool:
        """The whole body has arrived (it may still be unread)."""
        conn = self._conn
        return conn is None or conn.parser.state == DONE

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
        """Done with it: the connection goes back to the pool if the whole body has arrived,
        framed exactly and with nothing after it (unread, it is dropped), else it is cut."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pool.release(conn)

    def abort(self) -> None:
        """Cut the connection now (the server sees the disconnect at once)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()


class Owner(Protocol):
    """What a connection needs of the pool that owns it (`pool.ConnectionPool`): the read
    buffer its connections share, and to hear when one is free again or gone. A Protocol,
    so that this module does not import the pool, which imports it."""

    read_buffer: memoryview

    def release(self, conn: Connection) -> None: ...

    def forget(self, conn: Connection) -> None: ...


class Connection(asyncio.BufferedProtocol):
    """One TCP (or TLS) connection; feeds its bytes to a `ResponseParser`.

    It reads `READ_SIZE` at most per read: a backend that sends a whole long answer at
    once (they do, on loopback) then waits in the kernel's socket buffer instead of this
    process's memory, and each read is a batch that goes out to the client before the
    next is taken. The read buffer is the pool's, shared by its connections: a read is
    copied out of it before the event loop can run another (`buffer_updated` follows
    `get_buffer` at once), so one buffer serves them all.

    Bytes the parser finds out of turn (after the end of a response, or while idle in the
    pool) make the connection untrustworthy: it is cut at once.
    """

    def __init__(self, pool: Owner, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser()
        self.closed = False
        self.idle_since = 0.0
        self.got_any = False  # any byte of the current response arrived
        self.chunks: list[bytes] = []
        self.head: Head | None = None
        self._unread = 0
        self._paused = False
        self._exc: HTTPClientError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timeout = 0.0
        self._idle = 0.0  # the timeout once body bytes came (`_timeout` is the first byte's)
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._buffer = pool.read_buffer

    # -- the request ------------------------------------------------------------------

    async def exchange(
        self, payload: Payload, timeout: float, idle: float | None = None
    ) -> Response:
        """Send one request (its bytes, or its pieces in one vectored write); return its
        response once the head has arrived. `timeout` bounds the wait for the first body
        byte (the head may come before a backend has read the prompt), `idle` (default
        `timeout`) each gap after it."""
        assert self.transport is not None
        if self.closed or not self.parser.reusable:
            raise ServerDisconnected("the connection was closed before the request was sent")
        first = payload if isinstance(payload, bytes) else payload[0]
        self.parser.start(no_body=first.startswith(b"HEAD "))  # its answer has no body
        self.got_any, self._exc, self.head = False, None, None
        self._unread = 0
        self.chunks = []
        self._timeout = timeout
        self._idle = timeout if idle is None else idle
        if isinstance(payload, bytes):
            self.transport.write(payload)
        else:
            self.transport.writelines(payload)
        self._arm()
        while self.head is None:
            if self._exc is not None:
                raise self._exc
            await self._wait()
        return Response(self, self.head)

    async def wait_body(self) -> bytes:
        while not self.chunks:
            if self._exc is not None:
                raise self._exc
            if self.parser.state == DONE:
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
        return self.parser.reusable and not self.closed and not self._paused

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
        if self.parser.state in (HEAD, BODY) and self._exc is None:
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
        parser = self.parser
        try:
            events = parser.feed(data)
        except ProtocolError as exc:
            self._exc = exc
            self.abort()
            return
        for event in events:
            if event.__class__ is bytes:
                if self._timeout != self._idle:
                    self._to_idle()
                self.chunks.append(event)
                self._unread += len(event)
            elif event is END:
                self._disarm()
            else:
                self.head = event  # type: ignore[assignment]
        if parser.state == BROKEN:  # bad bytes after some good ones, which stand
            self._exc = parser.error
            self.abort()
            return
        if not parser.keep_alive and parser.state != BODY:
            self.abort()  # ended and not to be kept, or bytes out of turn: cut it now
            return
        if self._unread > HIGH_WATER and parser.state == BODY and not self._paused:
            self._paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
            self._disarm()  # a paused read is the consumer's doing, not the server's
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost tells the reader

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:  # our own abort
            return
        try:
            self.parser.eof(clean=exc is None)  # a clean close may end a body delimited by it
        except ServerDisconnected as lost:
            if self._exc is None:
                self._exc = lost
        self._lost()
        self._wake()

    def _lost(self) -> None:
        if not self.closed:
            self.closed = True
            self.parser.keep_alive = False
            self._disarm()
            self.pool.forget(self)

    # -- the idle timeout: one timer, moved on lazily ------------------------------------

    def _arm(self) -> None:
        self._last = now = self._loop.time()
        if self._timer is None and self.parser.state in (HEAD, BODY) and not self.closed:
            self._timer = self._loop.call_at(now + self._timeout, self._on_timer)

    def _to_idle(self) -> None:
        """The first body byte came: from now on the idle timeout runs, not the first byte's
        (a timer set for the longer one is set again)."""
        self._timeout = self._idle
        if self._timer is not None:
            self._disarm()
            self._timer = self._loop.call_at(self._last + self._timeout, self._on_timer)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self.parser.state not in (HEAD, BODY) or self._paused or self.closed:
            return
        due = self._last + self._timeout
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._on_timer)
            return
        self._exc = ReadTimeout(f"nothing from the server for {self._timeout:g} s")
        self.abort()
