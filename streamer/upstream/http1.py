"""A lean HTTP/1.1 client on asyncio protocols: one request at a time per kept-alive connection.

Made for the streaming POST to a Chat Completions backend, where a general client (aiohttp's)
costs more per request and per HTTP chunk than the gateway's whole pipeline behind it. The
body is handed over once per socket read, de-chunked in bulk (`http1_wire`), and the idle
timeout is one timer per response, pushed back lazily rather than per read.

- `ConnectionPool(url)`: keep-alive connections to one origin, reused last-in first-out and
  dropped after `keepalive` idle seconds; `await pool.request(payload, timeout)` returns a
  `Response` once its head has arrived.
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
import base64
import contextlib
import socket
import ssl
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

from multidict import CIMultiDict

from .http1_wire import (
    MAX_HEAD,
    ChunkedDecoder,
    ConnectError,
    HTTPClientError,
    ProtocolError,
    ReadTimeout,
    ServerDisconnected,
    body_length,
    parse_head,
)

HIGH_WATER = 64 << 10  # unread body bytes above which the socket is paused
STALE_AFTER = 1.0  # see ConnectionPool.request

_HEAD, _BODY, _DONE = 1, 2, 3  # phases of a response


# -- one connection ---------------------------------------------------------------------


class Response:
    """The answer to one request: status, reason, headers, and its body to `read()`."""

    __slots__ = ("_conn", "content_type", "headers", "reason", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
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


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; parses the response to the request in flight."""

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


# -- the pool -----------------------------------------------------------------------------


class ConnectionPool:
    """Keep-alive connections to the origin of `url` (http or https)."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 10,
        keepalive: float = 4.0,
        limit: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        stale_after: float = STALE_AFTER,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.hostname}")
        self.host = parts.hostname
        tls = parts.scheme == "https"
        self.port = parts.port or (443 if tls else 80)
        self.ssl = (ssl_context or ssl.create_default_context()) if tls else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if parts.port is None else f"{host}:{self.port}"
        self.basic_auth = None
        if parts.username is not None:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.basic_auth = "Basic " + base64.b64encode(user.encode()).decode()
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.stale_after = stale_after
        self._limit = asyncio.Semaphore(limit) if limit > 0 else None
        self._loop = asyncio.get_running_loop()
        self._idle: list[_Connection] = []  # a stack: the most recently used on top
        self._in_use: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def idle_count(self) -> int:
        return sum(1 for c in self._idle if not c.closed)

    @property
    def in_use_count(self) -> int:
        return len(self._in_use)

    def head(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], length: int | None
    ) -> bytes:
        """A request head (blank line included): Host and Connection added, CR/LF refused."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        lines.append("Connection: keep-alive")
        for name, value in headers:
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
                raise ValueError(f"invalid header {name!r}")
            lines.append(f"{name}: {value}")
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def request(self, payload: bytes, timeout: float) -> Response:
        """Send `payload` (head and body) and return the response once its head is in.

        A kept-alive connection that the server closed while it sat idle here (its close
        raced our request) is retried once on a new one, when nothing of a response arrived:
        the server never took that request. Only connections idle for `stale_after` seconds
        or more are suspected, since a server never drops a fresher one for idleness; a
        connection dropped sooner is a server refusing the request, which is not retried.
        """
        conn, idle_for = await self._acquire()
        try:
            return await conn.exchange(payload, timeout)
        except ServerDisconnected:
            if conn.got_any or idle_for < self.stale_after:
                raise
        except BaseException:
            conn.abort()  # cancelled or timed out: the server must see us go at once
            raise
        conn, _ = await self._acquire(fresh=True)
        try:
            return await conn.exchange(payload, timeout)
        except BaseException:
            conn.abort()
            raise

    async def close(self) -> None:
        self._closed = True
        for conn in [*self._idle, *self._in_use]:
            conn.abort()
        self._idle.clear()
        self._in_use.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    # -- internals ------------------------------------------------------------------------

    async def _acquire(self, fresh: bool = False) -> tuple[_Connection, float]:
        """A connection for one request, and how long it had been idle (-1: a new one).

        With a limit, a connection in use holds a slot until it is released or lost.
        """
        if self._limit is not None:
            await self._limit.acquire()
        try:
            now = self._loop.time()
            idle = self._idle
            while idle and not fresh:
                conn = idle.pop()
                if conn.closed:
                    continue
                if now - conn.idle_since >= self.keepalive:
                    conn.abort()
                    continue
                self._in_use.add(conn)
                return conn, now - conn.idle_since
            conn = await self._connect()
        except BaseException:
            if self._limit is not None:
                self._limit.release()
            raise
        self._in_use.add(conn)
        return conn, -1.0

    async def _connect(self) -> _Connection:
        conn = _Connection(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._loop.create_connection(
                    lambda: conn,
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            raise ConnectError(f"no connection within {self.connect_timeout:g} s") from None
        except ConnectionRefusedError:
            raise ConnectError("connection refused") from None
        except OSError as exc:
            raise ConnectError(exc.strerror or str(exc) or type(exc).__name__) from None
        if self._closed:
            conn.abort()
            raise ConnectError("the client is closed")
        if conn.closed:
            raise ServerDisconnected("the server closed the connection at once")
        return conn

    def release(self, conn: _Connection) -> None:
        """Back to the pool if its response ended cleanly (unread bytes of it are dropped)."""
        self._forget(conn)
        if conn.phase != _DONE or not conn.reusable or conn._paused or self._closed:
            conn.abort()
            return
        if conn.closed:
            return
        if conn.transport is not None and conn.transport.get_write_buffer_size():
            conn.abort()  # answered before the request was all sent: its rest is in the way
            return
        conn.chunks = []
        conn._unread = 0
        conn.idle_since = self._loop.time()
        self._idle.append(conn)
        if self._sweeper is None:
            self._sweeper = self._loop.call_at(conn.idle_since + self.keepalive, self._sweep)

    def _forget(self, conn: _Connection) -> None:
        if conn in self._in_use:
            self._in_use.discard(conn)
            if self._limit is not None:
                self._limit.release()

    def _sweep(self) -> None:
        """Close the connections idle for `keepalive` seconds (the oldest are at the bottom)."""
        self._sweeper = None
        now = self._loop.time()
        idle = self._idle
        while idle and (idle[0].closed or now - idle[0].idle_since >= self.keepalive):
            idle.pop(0).abort()
        if idle:
            self._sweeper = self._loop.call_at(idle[0].idle_since + self.keepalive, self._sweep)
