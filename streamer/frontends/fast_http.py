"""`POST /v1/responses` served on the raw transport, without aiohttp's request machinery.

The hot route's fixed cost was mostly the server's: aiohttp's request and response
objects, three middlewares, the body reader and the response's prepare/write/write_eof.
Here one task per request does what they did, once: the request id, the client key,
the door's busy marks and body timeout, the shutdown 503, the
request metrics and access log line, OpenAI's error shape, then `Gateway.prepare` and
`Gateway.run` as the aiohttp route calls them, the SSE answer written to the transport
(the head with the first batch, one chunk per batch, the last chunk with the last batch).

A connection starts here (`FastProtocol`, the front door's first protocol) and stays
only while its requests are plain (`request_head.parse`); anything else, and aiohttp's
protocol takes the connection over with the bytes buffered so far, for good. Background
turns go to aiohttp too. `--fast-http false` keeps every connection on aiohttp.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from typing import Any, Protocol, cast

import orjson
from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from streamer import logs, tracing
from streamer.config import Settings
from streamer.core import json_bounds, sse
from streamer.core.errors import RequestError, invalid, shutting_down, store_unavailable
from streamer.core.events import Event
from streamer.core.response import new_id
from streamer.frontends.api_keys import ApiKeys
from streamer.frontends.background import SSE_HEADERS
from streamer.frontends.request_head import (
    HAND_OVER,
    MAX_HEAD,
    MORE,
    Head,
    chunk,
    parse,
    response_head,
)
from streamer.gateway import Gateway
from streamer.logs import choose_request_id
from streamer.store import StoreUnavailable
from streamer.turn_runner import JSONSink

log = logging.getLogger("streamer.frontends.fast_http")

PATH = "/v1/responses"  # aiohttp's canonical name of the route, in the metrics


class Owner(Protocol):
    """The front door's side of a connection (`frontdoor._Connection`)."""

    def begin(self) -> None: ...
    def end(self) -> None: ...
    def hand_over(self, buffered: bytes) -> None: ...


def parse_json(raw: bytes | bytearray, max_values: int = json_bounds.MAX_VALUES) -> Any:
    """A request body as JSON, or the 400 that says why not (both servers' rule): not
    JSON, or JSON beyond the bounds (`json_bounds`: too deep, too many values)."""
    try:
        return json_bounds.loads(raw, max_values)
    except orjson.JSONDecodeError as exc:
        raise invalid(
            f"We could not parse the JSON body of your request ({exc.msg}).", code="invalid_json"
        ) from None


def background(request: Any) -> bool:
    """A background turn: aiohttp serves it (its snapshot, or the stream that follows it)."""
    return type(request) is dict and bool(request.get("background"))


def json_body(value: Any) -> bytes:
    """A whole JSON answer's body (one name, so that tests can watch what is answered)."""
    return orjson.dumps(value)


def internal_error() -> RequestError:
    return RequestError(
        "The gateway had an internal error.", status=500, type="server_error", code="server_error"
    )


class FastRoute:
    """What the fast connections of one app share: the gateway, the keys, the settings."""

    def __init__(
        self,
        gateway: Gateway,
        settings: Settings,
        keys: ApiKeys | None,
        extra_headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self.gateway = gateway
        self.keys = keys
        self.max_line = settings.max_header_bytes
        self.max_body = settings.max_body_bytes
        self.max_json_values = settings.max_json_values
        self.body_timeout = settings.client_body_timeout
        self.conns: set[FastProtocol] = set()
        self.closing = False
        self.served = 0  # requests answered here (the rest were aiohttp's)
        extra = "".join(f"{k}: {v}\r\n" for k, v in extra_headers or ())
        self._extra = extra.encode("latin-1")
        self._sse = response_head(200, [*SSE_HEADERS.items(), ("Transfer-Encoding", "chunked")])
        self._sse = self._sse[:-2]  # the fields shared by every stream, without the blank line
        self._date_at = -1
        self._date = b""

    def protocol(self, owner: Owner) -> FastProtocol:
        return FastProtocol(self, owner)

    def _tail(self, rid: str, close: bool) -> bytes:
        """Date, Server, Connection, X-Request-Id and the worker's header, blank line included."""
        now = int(time.time())
        if now != self._date_at:
            date = email.utils.formatdate(now, usegmt=True)
            self._date_at, self._date = (
                now,
                f"Date: {date}\r\nServer: {SERVER_SOFTWARE}\r\n".encode(),
            )
        connection = b"Connection: close\r\n" if close else b""
        return b"%b%bX-Request-Id: %b\r\n%b\r\n" % (
            self._date,
            connection,
            rid.encode("ascii"),
            self._extra,
        )

    def sse_head(self, rid: str, close: bool) -> bytes:
        return self._sse + self._tail(rid, close)

    def whole(
        self, status: int, body: bytes, rid: str, close: bool, headers: dict[str, str] | None = None
    ) -> bytes:
        """A whole JSON answer: head and body, for one write (`close` says Connection)."""
        fields = [("Content-Type", "application/json")]
        fields.extend((k, v) for k, v in (headers or {}).items() if k.lower() != "connection")
        fields.append(("Content-Length", str(len(body))))
        return response_head(status, fields)[:-2] + self._tail(rid, close) + body

    def shutdown(self) -> None:
        """The server is stopping: idle connections close now, busy ones after their answer."""
        self.closing = True
        for conn in list(self.conns):
            if conn.idle:
                conn.close()

    def close(self) -> None:
        for conn in list(self.conns):
            conn.close()

    async def serve(self, conn: FastProtocol, head: Head, body: Any) -> None:
        """One request, as observe_middleware frames it: id, metrics, access line."""
        started = time.monotonic()
        self.served += 1
        rid = choose_request_id(head.headers.get("x-request-id"), new_id("req"))
        logs.request_id.set(rid)  # this task's own context
        logs.request_fields.set({})
        tracing.continue_trace(head.headers)  # this task's own context: not undone
        status = 500
        try:
            status = await self._answer(conn, head, body, rid)
        except asyncio.CancelledError:
            status = 499  # the client went away first
            raise
        except ConnectionResetError:  # gone before its answer began: nobody to tell
            conn.close()
        finally:
            metrics = self.gateway.metrics
            metrics.child(metrics.requests, "POST", PATH, str(status)).inc()
            logs.access("POST", PATH, status, started, logs.request_fields.get())
            conn.done()

    async def _answer(self, conn: FastProtocol, head: Head, body: Any, rid: str) -> int:
        """The answer's status; every failure in OpenAI's error shape, as errors_middleware."""
        try:
            return await self._respond(conn, head, body, rid)
        except RequestError as exc:
            error = exc
        except StoreUnavailable as exc:
            error = store_unavailable(exc)
        except ConnectionResetError:
            raise
        except Exception:
            log.exception("unhandled error on POST %s", PATH)
            error = internal_error()
        if conn.answered:  # a stream under way cannot become an error answer: cut it
            conn.close()
            return 500
        self.reply(conn, rid, head.close, error)
        return error.status

    def reply(self, conn: FastProtocol, rid: str, close: bool, error: RequestError) -> None:
        headers = error.headers or {}
        close = close or any(
            k.lower() == "connection" and v.lower() == "close" for k, v in headers.items()
        )
        conn.send_whole(self.whole(error.status, orjson.dumps(error.body()), rid, close, headers))
        if close:
            conn.close_after = True

    async def _respond(self, conn: FastProtocol, head: Head, body: Any, rid: str) -> int:
        """create_response (and the auth middleware before it) on the fast path; `body`:
        the parsed JSON, or the error its parse raised (answered after the key check)."""
        gateway = self.gateway
        authorization = head.headers.get("authorization")
        who = self.keys.check(authorization) if self.keys is not None else None
        if gateway.in_flight.closing:
            raise shutting_down()
        if isinstance(body, RequestError):
            raise body
        request = body
        headers = {"Authorization": authorization} if authorization is not None else {}
        turn = await gateway.prepare(
            request, client=gateway.client(who, headers), authorization=authorization
        )
        gateway.stats["http_turns"] += 1
        if not request.get("stream"):
            await gateway.run(turn, JSONSink(), "json")
            conn.send_whole(self.whole(200, json_body(turn.response), rid, head.close))
            return 200
        sink = _SSESink(conn, self.sse_head(rid, head.close))
        try:
            await gateway.run(turn, sink, "sse")
        except ConnectionResetError:  # the client left between two writes
            if not sink.answered:
                raise
            return 200
        if not sink.ended:  # `run` sends the terminal event, or raises
            await sink.write(chunk(b"", True))
        return 200

    def late(self, conn: FastProtocol, head: Head) -> None:
        """The body did not arrive in time: the 408 read_json answers, then the close."""
        started = time.monotonic()
        rid = choose_request_id(head.headers.get("x-request-id"), new_id("req"))
        token = logs.request_id.set(rid)
        error = RequestError(
            f"The request body did not arrive within {self.body_timeout:g} seconds.",
            status=408,
            code="request_timeout",
            headers={"Connection": "close"},
        )
        self.reply(conn, rid, True, error)
        metrics = self.gateway.metrics
        metrics.child(metrics.requests, "POST", PATH, "408").inc()
        logs.access("POST", PATH, 408, started)
        logs.request_id.reset(token)
        conn.done()


class _SSESink:
    """A streamed turn on the transport: the head leaves with the first batch, each batch
    is one chunk, and the last one carries the end of the body."""

    __slots__ = ("conn", "ended", "head")

    def __init__(self, conn: FastProtocol, head: bytes) -> None:
        self.conn = conn
        self.head: bytes | None = head
        self.ended = False

    @property
    def answered(self) -> bool:
        return self.head is None

    async def send(self, batch: list[Event], final: bool) -> None:
        data = chunk(sse.encode_many(batch), final)
        head = self.head
        if head is not None:
            data, self.head = head + data, None
            self.conn.answered = True
        self.ended = final
        await self.write(data)

    async def write(self, data: bytes) -> None:
        if self.conn.write(data):
            await self.conn.drain()


class FastProtocol(asyncio.Protocol):
    """One client connection while its requests are the fast path's."""

    def __init__(self, route: FastRoute, owner: Owner) -> None:
        self.route = route
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()  # appended to in place: a body in many reads is not recopied
        self.searched = 0  # bytes of `buf` already searched for the end of a head
        self.head: Head | None = None  # a head whose body is still coming
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.answered = False  # the current answer's head has left
        self.close_after = False
        self.closed = False
        self.paused = False  # the transport's buffer is full: writes wait
        self.drained: asyncio.Future[None] | None = None
        self.reading = True

    @property
    def idle(self) -> bool:
        return self.task is None and self.head is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.route.conns.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._take()
        elif len(self.buf) > MAX_HEAD and self.reading:  # pipelined: read on after the answer
            self.reading = False
            self._transport().pause_reading()

    def _transport(self) -> asyncio.Transport:
        assert self.transport is not None
        return self.transport

    def _take(self) -> None:
        """The next request in the buffer: its task once it is whole, else wait or hand over."""
        route = self.route
        head = self.head
        if head is None:
            buf = self.buf
            parsed = parse(buf, max_line=route.max_line, max_body=route.max_body, at=self.searched)
            if parsed is MORE:
                self.searched = len(buf)  # a head trickled in is searched once, not per read
                return
            self.searched = 0
            if parsed is HAND_OVER:
                return self._hand_over()
            assert isinstance(parsed, Head)
            self.head = head = parsed
            self.owner.begin()
        end = head.size + head.length
        if len(self.buf) < end:
            if self.timer is None:
                loop = asyncio.get_running_loop()
                self.timer = loop.call_later(route.body_timeout, self._late)
            return
        self.head = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        try:
            body = parse_json(self.buf[head.size : end], route.max_json_values)
        except RequestError as exc:
            body = exc
        if background(body):
            self.owner.end()
            return self._hand_over()
        del self.buf[:end]
        self.answered = False
        self.close_after = head.close
        self.task = asyncio.get_running_loop().create_task(route.serve(self, head, body))

    def _hand_over(self) -> None:
        """aiohttp's protocol takes the connection, with everything read so far."""
        buffered, self.buf = bytes(self.buf), bytearray()
        self.route.conns.discard(self)
        if not self.reading:
            self.reading = True
            self._transport().resume_reading()
        self.owner.hand_over(buffered)

    def _late(self) -> None:
        self.timer = None
        head, self.head = self.head, None
        if head is not None and not self.closed:
            self.buf.clear()
            self.route.late(self, head)

    def done(self) -> None:
        """An answer ended: close if asked, else on to the next request."""
        self.task = None
        self.owner.end()
        if self.closed:
            return
        if self.close_after or self.route.closing:
            self.close()
            return
        if not self.reading:
            self.reading = True
            self._transport().resume_reading()
        if self.buf:
            self._take()

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
