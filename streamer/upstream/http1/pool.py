"""The keep-alive pools of the lean HTTP/1.1 client: connections to one origin.

`ConnectionPool`: connections (`http1.Connection`) are reused last-in first-out and
dropped after `keepalive` idle seconds; `await pool.request(payload, timeout)` returns a
`Response` once its head has arrived. `reuse=False` sends `Connection: close` and keeps
nothing.

`ClientPools`: one `ConnectionPool` per client identity. A stray response that arrives
after the next request was sent cannot be told from that request's answer, so a connection
only ever carries the requests of one client: a desynchronising backend can then answer a
client with nothing but its own words. Empty pools are dropped, and at most `max_pools`
exist (the least recently used is retired beyond).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import OrderedDict
from collections.abc import Callable, Iterable
from urllib.parse import SplitResult, unquote, urlsplit

from streamer.upstream.http1.connection import READ_SIZE, Connection, Payload, Response
from streamer.upstream.http1.connection_limit import ConnectionLimit, OpenConnections
from streamer.upstream.http1.proxy import Proxy, connect_to_proxy, open_tunnel
from streamer.upstream.http1.wire import ConnectError, ServerDisconnected

STALE_AFTER = 1.0  # see ConnectionPool.request


class ConnectionPool:
    """Keep-alive connections to the origin of `url` (http or https)."""

    def __init__(
        self,
        url: str | SplitResult,
        *,
        connect_timeout: float = 10,
        keepalive: float = 4.0,
        limit: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        stale_after: float = STALE_AFTER,
        reuse: bool = True,
        read_buffer: memoryview | None = None,
        proxy: Proxy | None = None,
        limiter: ConnectionLimit | asyncio.Semaphore | None = None,
        open_limit: OpenConnections | None = None,
    ) -> None:
        parts = url if isinstance(url, SplitResult) else urlsplit(url)  # parsed once upstream
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
        self.reuse = reuse  # False: one connection per request (`Connection: close`)
        self.stale_after = stale_after
        # the limit may be shared by several pools to the same origin (`limiter`)
        if limiter is None and limit > 0:
            limiter = asyncio.Semaphore(limit)
        self._limit = limiter
        self._open_cap = open_limit  # every backend connection of the process, idle ones too
        # through a proxy: https is tunnelled (CONNECT), http asks the proxy in absolute form
        self.proxy = proxy
        forward = proxy is not None and not tls
        self._target_prefix = f"http://{self.host_header}" if forward else ""
        self._proxy_auth = proxy.authorization if forward and proxy is not None else None
        self._loop = asyncio.get_running_loop()
        # every connection reads into this one (see `Connection`): 32 KiB, not 32 KiB each;
        # pools on one event loop may share one for the same reason
        self.read_buffer = read_buffer or memoryview(bytearray(READ_SIZE))
        self._idle: list[Connection] = []  # a stack: the most recently used on top
        self._in_use: set[Connection] = set()
        self._acquiring = 0  # requests waiting for a connection (a slot, or a connect)
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self._retired = False  # nothing more is kept: connections are cut when released

    @property
    def idle_count(self) -> int:
        return sum(1 for c in self._idle if not c.closed)

    @property
    def in_use_count(self) -> int:
        return len(self._in_use)

    @property
    def empty(self) -> bool:
        """No connection, idle or in use, and no request waiting for one."""
        return not self._acquiring and not self._in_use and not self.idle_count

    def head(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], length: int | None
    ) -> bytes:
        """A request head (blank line included): Host and Connection added, CR/LF refused."""
        lines = [f"{method} {self._target_prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        lines.append("Connection: keep-alive" if self.reuse else "Connection: close")
        if self._proxy_auth:
            lines.append(f"Proxy-Authorization: {self._proxy_auth}")
        for name, value in headers:
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
                raise ValueError(f"invalid header {name!r}")
            lines.append(f"{name}: {value}")
        if length is not None:
            lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def request(
        self, payload: Payload, timeout: float, idle: float | None = None
    ) -> Response:
        """Send `payload` (head and body) and return the response once its head is in.

        A kept-alive connection that the server closed while it sat idle here (its close
        raced our request) is retried once on a new one, when nothing of a response arrived:
        the server never took that request. Only connections idle for `stale_after` seconds
        or more are suspected, since a server never drops a fresher one for idleness; a
        connection dropped sooner is a server refusing the request, which is not retried.
        """
        conn, idle_for = await self._acquire()
        try:
            return await conn.exchange(payload, timeout, idle)
        except ServerDisconnected:
            if conn.got_any or idle_for < self.stale_after:
                raise
        except BaseException:
            conn.abort()  # cancelled or timed out: the server must see us go at once
            raise
        conn, _ = await self._acquire(fresh=True)
        try:
            return await conn.exchange(payload, timeout, idle)
        except BaseException:
            conn.abort()
            raise

    def retire(self) -> None:
        """Keep nothing more: idle connections are closed now, those in use when released
        (their requests go on)."""
        self._retired = True
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

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

    async def _acquire(self, fresh: bool = False) -> tuple[Connection, float]:
        """A connection for one request, and how long it had been idle (-1: a new one).

        With a limit, a connection in use holds a slot until it is released or lost.
        """
        self._acquiring += 1
        try:
            return await self._acquire_one(fresh)
        finally:
            self._acquiring -= 1

    async def _acquire_one(self, fresh: bool) -> tuple[Connection, float]:
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
                if self._open_cap is not None:
                    self._open_cap.busy(conn)
                self._in_use.add(conn)
                return conn, now - conn.idle_since
            conn = await self._connect()
        except BaseException:
            if self._limit is not None:
                self._limit.release()
            raise
        self._in_use.add(conn)
        return conn, -1.0

    async def _connect(self) -> Connection:
        """A new connection, once the open-connection cap has room for it."""
        if self._open_cap is None:
            return await self._dial()
        await self._open_cap.reserve()
        try:
            conn = await self._dial()
        except BaseException:
            self._open_cap.unreserve()
            raise
        self._open_cap.opened(conn)
        return conn

    async def _dial(self) -> Connection:
        conn = Connection(self, self._loop)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._open(conn)
        except TimeoutError:
            via = f" (through the proxy at {self.proxy.where})" if self.proxy else ""
            raise ConnectError(f"no connection within {self.connect_timeout:g} s{via}") from None
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

    async def _open(self, conn: Connection) -> None:
        """Connect `conn`: directly, to the proxy (http), or tunnelled through it (https)."""
        proxy = self.proxy
        if proxy is None:
            await self._loop.create_connection(
                lambda: conn,
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.host if self.ssl else None,
            )
        elif self.ssl is None:
            await connect_to_proxy(proxy, lambda: conn)
        else:
            await open_tunnel(proxy, self.host, self.port, conn, self.ssl)

    def release(self, conn: Connection) -> None:
        """Back to the pool if its response ended cleanly (unread bytes of it are dropped)."""
        self.forget(conn)
        if not conn.keepable or not self.reuse or self._closed or self._retired:
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
        if self._open_cap is not None:
            self._open_cap.idle(conn)  # (closed at once if other requests wait for room)

    def forget(self, conn: Connection) -> None:
        """No longer in use (released, or lost): its slot under the connection limit frees
        (and, once lost, its place under the open-connection cap)."""
        if conn in self._in_use:
            self._in_use.discard(conn)
            if self._limit is not None:
                self._limit.release()
        if conn.closed and self._open_cap is not None:
            self._open_cap.closed(conn)

    def _sweep(self) -> None:
        """Close the connections idle for `keepalive` seconds (the oldest are at the bottom)."""
        self._sweeper = None
        now = self._loop.time()
        idle = self._idle
        while idle and (idle[0].closed or now - idle[0].idle_since >= self.keepalive):
            idle.pop(0).abort()
        if idle:
            self._sweeper = self._loop.call_at(idle[0].idle_since + self.keepalive, self._sweep)


class ClientPools:
    """A `ConnectionPool` per client identity, made by `factory` on first use (see the
    module docstring). `max_pools` bounds how many exist at once."""

    def __init__(self, factory: Callable[[], ConnectionPool], max_pools: int = 256) -> None:
        self._factory = factory
        self.max_pools = max(1, max_pools)
        self._pools: OrderedDict[str, ConnectionPool] = OrderedDict()  # least recent first

    def __len__(self) -> int:
        return len(self._pools)

    def __contains__(self, client: object) -> bool:
        return client in self._pools

    def get(self, client: str) -> ConnectionPool:
        """The pool of `client` ("" is the anonymous client), made if it has none."""
        pools = self._pools
        pool = pools.get(client)
        if pool is not None:
            pools.move_to_end(client)
            return pool
        self._make_room()
        pool = pools[client] = self._factory()
        return pool

    @property
    def idle_count(self) -> int:
        return sum(p.idle_count for p in self._pools.values())

    @property
    def in_use_count(self) -> int:
        return sum(p.in_use_count for p in self._pools.values())

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), OrderedDict()
        for pool in pools:
            await pool.close()

    def _make_room(self) -> None:
        """Before a new pool: drop the empty ones, then, if still at the cap, retire the least
        recently used (its requests in flight finish; its connections are not kept)."""
        pools = self._pools
        for client in [c for c, p in pools.items() if p.empty]:
            pools.pop(client).retire()
        while len(pools) >= self.max_pools:
            pools.popitem(last=False)[1].retire()
