"""The client-facing door: header timeout and a cap on open client connections.

aiohttp has no header read timeout and no connection cap, so a peer that trickles a
request head (slowloris) holds a socket and a file descriptor for as long as it likes.
`Door` is the rule, over plain values: a connection is *waiting* from its accept, or
from the end of its previous response, until its next request head is complete; it is
*busy* while a request or a stream (SSE, WebSocket) is being served. A waiting
connection is closed at its header deadline. At the cap, a newcomer evicts the
connection that has waited longest; busy connections are never evicted; with none
waiting, the newcomer is refused.

The asyncio shell is thin: `GuardedSite` listens like `web.TCPSite`, with each
connection's protocol (aiohttp's own, from `runner.server`) wrapped in `_Connection`,
which asks the door at accept; `door_middleware` marks a request's start and end.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import Generic, TypeVar, cast

import orjson
from aiohttp import web

from streamer.core.errors import RequestError
from streamer.frontends.fast_http import FAST_ROUTE, FastRoute

K = TypeVar("K", bound=Hashable)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

TICK = 0.05  # deadlines are checked in batches this far apart: one timer, not one each
HEAD_TIMEOUT = "The request head did not arrive in time."
EVICTED = "The gateway needed this connection: the request head did not arrive in time."


@dataclass(frozen=True, slots=True)
class Admission:
    """What `Door.accept` decided: `admitted`, and the connection evicted to make room."""

    admitted: bool
    evicted: Hashable | None = None
    evicted_partial: bool = False  # the evicted one had begun a head: it is told why


@dataclass(slots=True)
class DoorStats:
    accepted: int = 0
    refused: int = 0
    evicted: int = 0
    timed_out: int = 0


@dataclass
class Door(Generic[K]):
    """Which client connections to keep, evict or close; times are plain numbers."""

    capacity: int
    header_timeout: float
    # waiting connections -> since when, oldest first (insertion order = time order)
    _waiting: dict[K, float] = field(default_factory=dict)
    _busy: dict[K, int] = field(default_factory=dict)  # -> requests being served
    _heard: set[K] = field(default_factory=set)  # waiting, and part of a head came
    stats: DoorStats = field(default_factory=DoorStats)

    @property
    def open(self) -> int:
        return len(self._waiting) + len(self._busy)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def accept(self, conn: K, now: float) -> Admission:
        """A new connection: admitted (perhaps evicting the longest waiter) or refused."""
        evicted: K | None = None
        partial = False
        if self.open >= self.capacity:
            if not self._waiting:
                self.stats.refused += 1
                return Admission(False)
            evicted = next(iter(self._waiting))
            partial = self.partial(evicted)
            self.close(evicted)
            self.stats.evicted += 1
        self._waiting[conn] = now
        self.stats.accepted += 1
        return Admission(True, evicted, partial)

    def heard(self, conn: K) -> None:
        """Bytes arrived: if `conn` waits for a head, part of one is in."""
        if conn in self._waiting:
            self._heard.add(conn)

    def partial(self, conn: K) -> bool:
        """Whether `conn` has sent part of a head it has not finished."""
        return conn in self._heard

    def begin(self, conn: K) -> None:
        """A request head is complete: busy until its response ends."""
        if conn in self._waiting:
            del self._waiting[conn]
            self._heard.discard(conn)
            self._busy[conn] = 0
        if conn in self._busy:
            self._busy[conn] += 1

    def end(self, conn: K, now: float) -> None:
        """A response ended: with no other request in flight, `conn` waits from `now`."""
        served = self._busy.get(conn)
        if served is None:
            return  # closed meanwhile
        if served > 1:
            self._busy[conn] = served - 1
            return
        del self._busy[conn]
        self._waiting[conn] = now

    def close(self, conn: K) -> None:
        """`conn` is gone (or being closed): it holds no slot any more."""
        self._waiting.pop(conn, None)
        self._busy.pop(conn, None)
        self._heard.discard(conn)

    def expired(self, now: float) -> list[K]:
        """The waiting connections past their header deadline, removed from the door."""
        late: list[K] = []
        for conn, since in self._waiting.items():
            if since + self.header_timeout > now:
                break
            late.append(conn)
        for conn in late:
            del self._waiting[conn]
        self.stats.timed_out += len(late)
        return late

    def next_deadline(self) -> float | None:
        """The earliest header deadline of a waiting connection (None: none waits)."""
        for since in self._waiting.values():
            return since + self.header_timeout
        return None


def timeout_reply(message: str) -> bytes:
    """A whole `408` in OpenAI's error shape, for a connection about to be closed."""
    error = RequestError(message, status=408, code="request_timeout")
    body = orjson.dumps(error.body())
    head = (
        "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class FrontDoor:
    """The door of one process, shared by its sites; its clock is the event loop's."""

    def __init__(self, max_connections: int, header_timeout: float) -> None:
        # `--max-client-connections`, or its share of the open-file limit (fd_budget.py)
        self.door: Door[_Connection] = Door(max_connections, header_timeout)
        self._by_transport: dict[asyncio.BaseTransport, _Connection] = {}
        self._timer: asyncio.TimerHandle | None = None

    def report(self) -> dict[str, int]:
        """Open and waiting connections, the cap, and what the door did so far."""
        door = self.door
        counts = {"open": door.open, "waiting": door.waiting, "capacity": door.capacity}
        return counts | asdict(door.stats)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def admit(self, conn: _Connection, transport: asyncio.BaseTransport) -> bool:
        decision = self.door.accept(conn, self._now())
        if isinstance(decision.evicted, _Connection):
            decision.evicted.shut(EVICTED, decision.evicted_partial)
        if decision.admitted:
            self._by_transport[transport] = conn
            self._arm()
        return decision.admitted

    def gone(self, conn: _Connection, transport: asyncio.BaseTransport | None) -> None:
        self.door.close(conn)
        if transport is not None:
            self._by_transport.pop(transport, None)

    def begin(self, transport: asyncio.BaseTransport | None) -> _Connection | None:
        conn = self._by_transport.get(transport) if transport is not None else None
        if conn is not None:
            self.door.begin(conn)
        return conn

    def end(self, conn: _Connection) -> None:
        self.door.end(conn, self._now())
        self._arm()

    def _arm(self) -> None:
        deadline = self.door.next_deadline()
        if self._timer is None and deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(deadline + TICK, self._expire)

    def _expire(self) -> None:
        self._timer = None
        for conn in self.door.expired(self._now()):
            conn.shut(HEAD_TIMEOUT, self.door.partial(conn))
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Connection(asyncio.Protocol):
    """One client connection's protocol, created only once the door admits it: the fast
    path's first if there is one (`fast_http`), aiohttp's once it is handed over."""

    def __init__(
        self,
        front: FrontDoor,
        factory: Callable[[], asyncio.Protocol],
        fast: FastRoute | None = None,
    ) -> None:
        self.front = front
        self.factory = factory
        self.fast = fast
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but quack the same
        self.transport = cast(asyncio.Transport, transport)
        if not self.front.admit(self, transport):
            transport.close()  # at the cap, every slot busy: refused at once
            return
        self.inner = self.factory() if self.fast is None else self.fast.protocol(self)
        self.inner.connection_made(transport)

    def hand_over(self, reads: list[bytes]) -> None:
        """The fast path lets go: aiohttp's protocol owns the connection from here on, and
        reads what was read so far as it would have, one read at a time."""
        inner = self.inner = self.factory()
        inner.connection_made(cast(asyncio.Transport, self.transport))
        for data in reads:
            inner.data_received(data)

    def begin(self) -> None:
        """A request head is complete (the fast path's door_middleware)."""
        self.front.door.begin(self)

    def end(self) -> None:
        self.front.end(self)

    def shut(self, message: str, partial: bool) -> None:
        """Evicted or timed out: a 408 if a head had begun (an idle keep-alive connection
        gets nothing: a client could take it for its next request's answer), then close."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if partial:
            transport.write(timeout_reply(message))
        self.front.gone(self, transport)
        transport.close()

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.front.door.heard(self)
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.gone(self, self.transport)
        if self.inner is not None:
            self.inner.connection_lost(exc)
        self.inner = None


FRONT_DOOR = web.AppKey("front_door", FrontDoor)


def door_middleware(front: FrontDoor) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Marks a connection busy from its request head to the end of its response.

    The response is finished here (aiohttp's own prepare/write_eof after the handler
    then do nothing), so that a large answer to a slow reader is not cut as idle.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = front.begin(request.transport)
        try:
            response = await handler(request)
            # a client gone mid-write: aiohttp's own finish then ends it quietly, as before
            with contextlib.suppress(ConnectionError):
                await response.prepare(request)
                await response.write_eof()
            return response
        finally:
            if conn is not None:
                front.end(conn)

    return middleware


class GuardedSite(web.BaseSite):
    """`web.TCPSite` with the app's `FrontDoor` at every connection."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        backlog: int = 128,
        reuse_port: bool = False,  # one of several workers' sockets on the port
        sock: socket.socket | None = None,  # an inherited listening socket instead
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self.runner = runner
        self.host = host
        self.requested_port = port
        self.backlog = backlog
        self.reuse_port = reuse_port
        self.sock = sock
        self.listener: asyncio.Server | None = None

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port once started (the requested one before)."""
        if self.listener is not None and self.listener.sockets:
            return int(self.listener.sockets[0].getsockname()[1])
        return self.requested_port

    async def start(self) -> None:
        await super().start()
        server = self.runner.server
        assert server is not None
        front = self.runner.app[FRONT_DOOR]
        fast = self.runner.app.get(FAST_ROUTE)  # --fast-http (set at startup)
        loop = asyncio.get_running_loop()
        if self.sock is not None:
            self.listener = await loop.create_server(
                lambda: _Connection(front, server, fast), sock=self.sock, backlog=self.backlog
            )
            return
        self.listener = await loop.create_server(
            lambda: _Connection(front, server, fast),
            self.host,
            self.requested_port,
            backlog=self.backlog,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
        )

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()  # no new connections; open ones are the runner's
        await super().stop()
