"""`POST /v1/responses` served on the raw transport, without aiohttp's request machinery.

The hot route's fixed cost was mostly the server's: aiohttp's request and response
objects, three middlewares, the body reader, the response's prepare/write/write_eof. Here a
connection starts on the fast path (`FastProtocol`, the front door's first protocol);
`fast_connection.py` says which requests it serves (a plain POST /v1/responses, whole,
nothing after it) and when aiohttp's protocol takes the connection over, for good, read by
read. A request served here meets the endpoint's rules (`endpoint.py`) as aiohttp's handler
does: the key and the rest of the head before any byte of the body, the body counted and
decoded as it comes, then `Endpoint.serve`. What is left here is the framing of answers:
a whole JSON answer in one write; a stream's head with its first batch, one chunk per
batch, the last chunk with the last batch. Background turns go to aiohttp.

`--fast-http false` keeps every connection on aiohttp; so does an aiohttp without its C
parser, whose reading of a head is not llhttp's. The fast path is kept while it pays (at
least 40 µs of CPU per one-token request, same run: `bench/fresh_probes.py`, README).
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from http import HTTPStatus
from typing import Any, Protocol, cast

import orjson
from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from streamer.config import Settings
from streamer.core.errors import RequestError
from streamer.frontends.background import SSE_HEADERS
from streamer.frontends.endpoint import Endpoint, closes, error_answer
from streamer.frontends.fast_connection import MAX_HEAD, FastConnection, Request, State, Step
from streamer.stopping import Draining

PATH = "/v1/responses"  # aiohttp's canonical name of the route, in the metrics
TRANSFER = ("Transfer-Encoding", "chunked")


def same_parser() -> bool:
    """aiohttp reads requests with llhttp (its C extension), as the fast path does."""
    from aiohttp import http_parser

    return http_parser.HttpRequestParser is getattr(http_parser, "HttpRequestParserC", None)


class Owner(Protocol):
    """The front door's side of a connection (`frontdoor._Connection`)."""

    def begin(self) -> None: ...
    def end(self) -> None: ...
    def hand_over(self, reads: list[bytes]) -> None: ...


def chunk(data: bytes, last: bool = False) -> bytes:
    """`data` as one chunk of a chunked body (none when empty), then its end if `last`."""
    framed = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
    return framed + b"0\r\n\r\n" if last else framed


def response_head(status: int, fields: list[tuple[str, str]]) -> bytes:
    """The status line and header fields of an answer, blank line included."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{name}: {value}" for name, value in fields)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class FastRoute:
    """What the fast connections of one app share: the endpoint, and the framing."""

    def __init__(
        self, endpoint: Endpoint, settings: Settings, draining: Draining | None = None
    ) -> None:
        self.endpoint = endpoint
        self.draining = draining or Draining()  # stopping.py's drain window
        self.max_field = settings.max_header_bytes
        self.body_timeout = settings.client_body_timeout
        self.conns: set[FastProtocol] = set()
        self.closing = False
        self.stats = endpoint.gateway.stats  # /healthz shows `fast_http_requests`
        self.stats.setdefault("fast_http_requests", 0)  # answered here (the rest: aiohttp's)
        # the fields shared by every stream, without the blank line
        self.sse_fields = response_head(200, [*SSE_HEADERS.items(), TRANSFER])[:-2]
        self._date_at = -1
        self._date = b""

    @property
    def served(self) -> int:
        return self.stats["fast_http_requests"]

    def protocol(self, owner: Owner) -> FastProtocol:
        return FastProtocol(self, owner)

    def admit(self, request: Request) -> None:
        """`fast_connection.Rules`: the endpoint's head rules, in aiohttp's order (its auth
        middleware, then the handler): key, shutdown, media type, coding, length."""
        endpoint = self.endpoint
        headers = request.headers
        request.who = endpoint.authenticate(headers.get("authorization"))
        endpoint.open()
        coding = headers.get("content-encoding")
        request.reader = endpoint.admit(request.mime, coding, request.length)

    def tail(self, rid: str, close: bool) -> bytes:
        """Date, Server, Connection and the endpoint's decorations, blank line included."""
        now = int(time.time())
        if now != self._date_at:
            date = email.utils.formatdate(now, usegmt=True)
            self._date_at, self._date = (
                now,
                f"Date: {date}\r\nServer: {SERVER_SOFTWARE}\r\n".encode(),
            )
        connection = b"Connection: close\r\n" if close else b""
        return b"%b%b%b\r\n" % (self._date, connection, self.endpoint.decorations.lines(rid))

    def whole(
        self, status: int, body: bytes, rid: str, close: bool, headers: dict[str, str] | None = None
    ) -> bytes:
        """A whole JSON answer: head and body, for one write (`close` says Connection)."""
        fields = [("Content-Type", "application/json")]
        fields.extend((k, v) for k, v in (headers or {}).items() if k.lower() != "connection")
        fields.append(("Content-Length", str(len(body))))
        return response_head(status, fields)[:-2] + self.tail(rid, close) + body

    def failure(self, error: RequestError, rid: str, close: bool) -> bytes:
        """An error answer in OpenAI's shape; `close` also if the error says so."""
        body = orjson.dumps(error.body())
        return self.whole(error.status, body, rid, close or closes(error), error.headers)

    def shutdown(self) -> None:
        """The server is stopping: idle connections close now, busy ones after their answer."""
        self.closing = True
        for conn in list(self.conns):
            if conn.idle:
                conn.close()

    def close(self) -> None:
        for conn in list(self.conns):
            conn.close()

    def refuse(self, conn: FastProtocol, request: Request) -> None:
        """An answer from the head, or from a body cut short (401, 413, 415, 408, …);
        the connection closes after it."""
        error = request.error
        assert error is not None
        self.stats["fast_http_requests"] += 1
        offered = request.headers.get("x-request-id")
        with self.endpoint.observe("POST", PATH, PATH, offered) as seen:
            seen.status = error.status
            conn.send_whole(self.failure(error, seen.rid, True))

    async def serve(self, conn: FastProtocol, request: Request, body: Any) -> None:
        """One request, observed (id, metrics, access line), answered by the endpoint."""
        self.stats["fast_http_requests"] += 1
        offered = request.headers.get("x-request-id")
        try:
            with self.endpoint.observe("POST", PATH, PATH, offered, request.headers) as seen:
                seen.status = await self._answer(conn, request, body, seen.rid)
        except ConnectionResetError:  # gone before its answer began: nobody to tell
            conn.close()
        finally:
            conn.done()

    async def _answer(self, conn: FastProtocol, request: Request, body: Any, rid: str) -> int:
        """The answer's status; a failure in OpenAI's error shape (`error_answer`)."""
        endpoint = self.endpoint
        if self.draining.open:  # the drain window (stopping.py): the answer closes it
            request.close = conn.close_after = True
        reply = _Reply(self, conn, rid, request.close)
        try:
            if isinstance(body, RequestError):
                raise body
            authorization = request.headers.get("authorization")
            turn = await endpoint.prepare(body, request.who, authorization)
            await endpoint.serve(turn, reply)
            return 200
        except ConnectionResetError:
            raise
        except Exception as exc:
            error = error_answer(exc, f"POST {PATH}")
        if reply.started:  # a stream under way cannot become an error answer: cut it
            conn.close()
            return 500
        conn.send_whole(self.failure(error, rid, request.close))
        conn.close_after |= closes(error)
        return error.status


class _Reply:
    """The endpoint's `Reply` on the transport: a whole answer in one write, or a stream
    whose head leaves with its first chunk."""

    __slots__ = ("close", "conn", "rid", "route", "started")

    def __init__(self, route: FastRoute, conn: FastProtocol, rid: str, close: bool) -> None:
        self.route, self.conn, self.rid, self.close = route, conn, rid, close
        self.started = False  # the stream's head is out: no error answer now

    async def json(self, body: bytes) -> None:
        self.conn.send_whole(self.route.whole(200, body, self.rid, self.close))

    async def stream(self, data: bytes, last: bool) -> None:
        framed = chunk(data, last)
        if not self.started:
            self.started = True
            route = self.route
            framed = route.sse_fields + route.tail(self.rid, self.close) + framed
        if self.conn.write(framed):
            await self.conn.drain()


class FastProtocol(asyncio.Protocol):
    """The asyncio shell of one `FastConnection`: it feeds it bytes, runs what it says
    (an answer's task, a refusal, the hand-over, a close) and keeps the front door told."""

    def __init__(self, route: FastRoute, owner: Owner) -> None:
        self.route = route
        self.owner = owner
        self.conn = FastConnection(route, route.max_field, route.body_timeout)
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timed: State | None = None  # the state the timer is for
        self.busy = False  # what the front door was told
        self.close_after = False
        self.closed = False
        self.paused = False  # the transport's buffer is full: writes wait
        self.drained: asyncio.Future[None] | None = None
        self.reading = True

    @property
    def idle(self) -> bool:
        return self.task is None and not self.conn.busy

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.route.conns.add(self)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        self._act(conn.received(data))
        if conn.state is State.ANSWERING and conn.held > MAX_HEAD and self.reading:
            self.reading = False  # pipelined: read on after the answer
            self._transport().pause_reading()

    def _transport(self) -> asyncio.Transport:
        assert self.transport is not None
        return self.transport

    def _act(self, step: Step) -> None:
        conn = self.conn
        while True:
            self._sync()
            if step is Step.REFUSE:
                assert conn.request is not None
                self.route.refuse(self, conn.request)
                step = conn.answered()
                continue
            if step is Step.SERVE:
                self._serve()
            elif step is Step.HAND_OVER:
                self._give(conn.handed)
            elif step is Step.CLOSE:
                self.close()
            return

    def _sync(self) -> None:
        """The front door's busy mark and the body (or lingering) timer, as the state is."""
        conn = self.conn
        busy = conn.request is not None and conn.state is not State.DISCARDING  # conn.busy
        if busy is not self.busy:
            self.busy = busy
            if busy:
                self.owner.begin()
            else:
                self.owner.end()
        state = conn.state if conn.state in (State.BODY, State.DISCARDING) else None
        if state is not self.timed:
            if self.timer is not None:
                self.timer.cancel()
            self.timed, self.timer = state, None
            if state is not None:
                # a refused body is read and dropped for as long (aiohttp's lingering)
                seconds = self.route.body_timeout
                self.timer = asyncio.get_running_loop().call_later(seconds, self._expired)

    def _expired(self) -> None:
        self.timer, self.timed = None, None
        if not self.closed:
            self._act(self.conn.expired())

    def _serve(self) -> None:
        request = self.conn.request
        assert request is not None
        try:
            body = self.route.endpoint.parse(request.body, request.headers.get("authorization"))
        except RequestError as exc:
            body = exc.with_traceback(None)  # its frames would hold the body until answered
        if type(body) is dict and body.get("background"):  # aiohttp's: its snapshot, its follow
            self._give(self.conn.hand_over())
            return
        request.body, request.reads = b"", []  # parsed, and served here: neither is needed
        self.close_after = request.close
        self.task = asyncio.get_running_loop().create_task(self.route.serve(self, request, body))

    def _give(self, reads: list[bytes]) -> None:
        """aiohttp's protocol takes the connection, with every read of this request."""
        self._sync()
        self.route.conns.discard(self)
        if not self.reading:
            self.reading = True
            self._transport().resume_reading()
        self.owner.hand_over(reads)

    def done(self) -> None:
        """An answer ended: close if asked, else on to what came meanwhile."""
        self.task = None
        if self.closed:
            return
        if self.close_after or self.route.closing:
            self.close()
            return
        if not self.reading:
            self.reading = True
            self._transport().resume_reading()
        self._act(self.conn.answered())

    def send_whole(self, data: bytes) -> None:
        """A whole answer: written, nothing to wait for (the transport buffers it)."""
        if not self.closed:
            self._transport().write(data)

    def write(self, data: bytes) -> bool:
        """Part of a stream; True if the reader is slow and the writer must `drain`."""
        if self.closed:
            raise ConnectionResetError("the client went away")
        self._transport().write(data)
        return self.paused

    async def drain(self) -> None:
        if self.paused:
            self.drained = asyncio.get_running_loop().create_future()
            await self.drained

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # as aiohttp: the transport closes, an answer in flight is cancelled

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.conn.lost()
        self.route.conns.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_exception(ConnectionResetError("the client went away"))
        if self.task is not None:  # as aiohttp's handler_cancellation: the turn stops
            self.task.cancel()


FAST_ROUTE = web.AppKey("fast_route", FastRoute)
