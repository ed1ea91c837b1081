"""The Responses endpoint, whichever server carries the request: aiohttp's handlers
(`frontends/http.py`) and the fast path (`frontends/fast_http.py`) are adapters over it.

Each rule a request meets is here once, in the order both servers apply them:

1. the key, from the head alone (`Endpoint.authenticate`): a 401 that closes the
   connection, before any byte of the body is read (`api_keys.py`);
2. the shutdown 503 (`Endpoint.open`), then what the head says of the body
   (`Endpoint.admit`): its media type and coding (415), a declared length over the limit
   (413); a refusal from the head closes the connection too;
3. the body (`request_body.BodyReader`): wire and decoded bytes each held to a limit as
   they come, then the one JSON parse of a request body (`parse_body`, bounded in depth
   and values by `core/json_bounds.py`);
4. the turn (`Endpoint.prepare`, `Endpoint.serve`): the client it acts for, then
   `Gateway.run` (which tracks it for the shutdown drain) into a JSON answer or an SSE
   stream (`SSESink`, written through the server's `Reply`, with `--sse-keepalive`
   comments on a quiet stretch);
5. what a failure says (`error_answer`), the one mapping aiohttp's middleware uses too;
6. the observed request (`Observed`): its request id, metrics and access line;
7. the headers every answer carries (`Decorations`): its request id, a worker's index.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Protocol

import orjson

from streamer import logs, tracing
from streamer.core import json_bounds, sse
from streamer.core.errors import RequestError, invalid, shutting_down, store_unavailable
from streamer.core.events import Event
from streamer.core.identity import client_identity
from streamer.core.replayed_json import MIN_BYTES, ReplayedBodies
from streamer.core.response import new_id
from streamer.frontends.api_keys import ApiKeys, credential
from streamer.frontends.keepalive import Keepalive
from streamer.frontends.request_body import BodyReader, check_coding, check_media, closing
from streamer.logs import choose_request_id
from streamer.metrics import Metrics
from streamer.store import StoreUnavailable
from streamer.turns.gateway import Gateway
from streamer.turns.turn import Turn
from streamer.turns.turn_runner import JSONSink

log = logging.getLogger("streamer.frontends.endpoint")

REQUEST_ID = "X-Request-Id"


def parse_body(
    raw: bytes,
    max_values: int = json_bounds.MAX_VALUES,
    bodies: ReplayedBodies | None = None,
    authorization: str | None = None,
) -> Any:
    """A request body as JSON, or the 400 that says why not (not JSON, or JSON beyond the
    bounds of `json_bounds`: too deep, too many values): the one place a request body is
    parsed, on both servers (`Endpoint.parse`). `bodies`: a long body that replays a recent
    one of the same Authorization is parsed past its bytes only (core/replayed_json.py)."""
    try:
        if bodies is not None and len(raw) >= MIN_BYTES:
            client = client_identity(authorization) if authorization else ""
            return bodies.loads(raw, client, max_values)
        return json_bounds.loads(raw, max_values)
    except orjson.JSONDecodeError as exc:
        raise invalid(
            f"We could not parse the JSON body of your request ({exc.msg}).", code="invalid_json"
        ) from None


def json_body(value: Any) -> bytes:
    """A whole JSON answer's body (one name, so that tests can watch what is answered)."""
    return orjson.dumps(value)


def internal_error() -> RequestError:
    return RequestError(
        "The gateway had an internal error.", status=500, type="server_error", code="server_error"
    )


def error_answer(exc: Exception, where: str) -> RequestError:
    """What a failure says to the client, in OpenAI's shape: a `RequestError` as it is, a
    store outage as a 503, anything else as a 500 (and its traceback in the log)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, StoreUnavailable):
        return store_unavailable(exc)
    log.error("unhandled error on %s", where, exc_info=exc)
    return internal_error()


def closes(error: RequestError) -> bool:
    """Whether the connection closes after `error` is answered."""
    return any(k.lower() == "connection" and v.lower() == "close" for k, v in error.headers.items())


class Decorations:
    """The headers every answer carries besides its own: its request id, then those added
    at startup (`add`: a worker's `X-Streamer-Worker`). aiohttp's `on_response_prepare`
    hook and the fast path's answers both take them from here."""

    __slots__ = ("_lines", "fixed")

    def __init__(self) -> None:
        self.fixed: list[tuple[str, str]] = []
        self._lines: bytes | None = None

    def add(self, name: str, value: str) -> None:
        self.fixed.append((name, value))
        self._lines = None

    def fields(self, rid: str | None) -> list[tuple[str, str]]:
        return [(REQUEST_ID, rid), *self.fixed] if rid is not None else list(self.fixed)

    def lines(self, rid: str) -> bytes:
        """`fields(rid)` as header lines, for a server that writes its heads itself."""
        if self._lines is None:
            self._lines = "".join(f"{k}: {v}\r\n" for k, v in self.fixed).encode("latin-1")
        return b"%b: %b\r\n%b" % (REQUEST_ID.encode(), rid.encode("ascii"), self._lines)


class Observed:
    """One request as operators see it: its id (the client's `X-Request-Id` when sane),
    the request metric and the access line (with its turn's fields, `logs.request_fields`),
    and (tracing on) the client's `traceparent` in `headers` continued. `status` is the
    answer's, set by whoever answers; 500 if nothing did, 499 if the client left first."""

    __slots__ = (
        "_fields", "_token", "_trace", "headers", "method", "metrics", "path", "rid", "route",
        "started", "status",
    )  # fmt: skip

    def __init__(
        self,
        metrics: Metrics,
        method: str,
        route: str,
        path: str,
        offered: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.started = time.monotonic()
        self.metrics, self.method, self.route, self.path = metrics, method, route, path
        self.rid = choose_request_id(offered, new_id("req"))
        self.status = 500
        self.headers = headers

    def __enter__(self) -> Observed:
        self._token = logs.request_id.set(self.rid)
        # the turn's part of the access line goes here (nothing to hold with it off)
        self._fields = logs.request_fields.set({}) if logs.access_on() else None
        headers = self.headers
        self._trace = tracing.continue_trace(headers) if headers is not None else None
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None and issubclass(kind, asyncio.CancelledError):
            self.status = 499  # the client went away first
        self.metrics.request(self.method, self.route, self.status)
        tracing.restore(self._trace)
        fields = self._fields
        if fields is not None:
            logs.access(
                self.method, self.path, self.status, self.started, logs.request_fields.get()
            )
            logs.request_fields.reset(fields)
        logs.request_id.reset(self._token)


class Reply(Protocol):
    """How one server answers one request: a whole 200 JSON body, or SSE data (the first
    piece leaves with the head; `last` ends the body)."""

    async def json(self, body: bytes) -> None: ...

    async def stream(self, data: bytes, last: bool) -> None: ...


class SSESink:
    """A streamed turn: one write per batch of events ready at once. The answer starts
    with the first batch (a backend that refuses the turn before any event is still an
    HTTP error); the last batch and the end of the body leave in one write. From the first
    batch on, a stretch quieter than `keepalive` seconds (`--sse-keepalive`; 0: never)
    gets a comment (`frontends/keepalive.py`), so a proxy's idle timeout does not cut it."""

    __slots__ = ("answered", "comments", "ended", "interval", "reply")

    def __init__(self, reply: Reply, keepalive: float = 0.0) -> None:
        self.reply = reply
        self.answered = False
        self.ended = False
        self.interval = keepalive
        self.comments: Keepalive | None = None  # once the head is out

    async def send(self, batch: list[Event], final: bool) -> None:
        comments = self.comments
        if comments is None and not final and self.interval > 0:
            comments = self.comments = Keepalive(self.interval, self._comment)
        elif comments is not None and final:
            comments.stop()
        elif comments is not None:
            comments.wrote()
        self.answered = True
        self.ended = final
        await self.reply.stream(sse.encode_many(batch), final)

    async def _comment(self, data: bytes) -> None:
        await self.reply.stream(data, False)

    def close(self) -> None:
        """No comment from now on (the turn is over, however it ended)."""
        if self.comments is not None:
            self.comments.stop()

    async def end(self) -> None:
        self.close()
        if not self.ended:  # `run` sends the terminal event, or raises
            self.ended = True
            await self.reply.stream(b"", True)


def _response(turn: Turn) -> Any:
    return turn.response


class Endpoint:
    """The rules of one gateway's requests (see the module docstring), for any server."""

    def __init__(self, gateway: Gateway, keys: ApiKeys | None, decorations: Decorations) -> None:
        settings = gateway.settings
        self.gateway = gateway
        self.keys = keys
        self.decorations = decorations
        self.forward = settings.forward_authorization
        self.max_body = settings.max_body_bytes
        self.max_decoded = settings.max_decoded_body_bytes
        self.max_json_values = settings.max_json_values
        self.body_timeout = settings.client_body_timeout
        self.keepalive = settings.sse_keepalive

    @property
    def guards(self) -> bool:
        """Whether the Authorization header is read at all (keys, or forwarded)."""
        return self.keys is not None or self.forward

    def authenticate(self, authorization: str | None) -> str | None:
        """The client key's identity (None: the gateway takes no keys), or the 401; a
        header that cannot be a credential is a 401 when it would be forwarded too."""
        if self.keys is not None:
            return self.keys.check(authorization)
        if self.forward:
            credential(authorization)
        return None

    def open(self) -> None:
        """New turns are taken (the 503 while shutting down)."""
        if self.gateway.in_flight.closing:
            raise closing(shutting_down())

    def admit(self, mime: str, coding: str | None, length: int | None) -> BodyReader:
        """The reader of a body whose head says `mime`, `coding` and `length` (None: not
        given), or the 415 / 413 its head already earns."""
        check_media(mime)
        taken = check_coding(coding)
        return BodyReader(taken, self.max_body, self.max_decoded, length)

    def parse(self, raw: bytes, authorization: str | None = None) -> Any:
        """The body as JSON, within `--max-json-values` (`parse_body`; a replay of a recent
        body of the same `authorization` parsed past it: `Gateway.bodies`)."""
        return parse_body(raw, self.max_json_values, self.gateway.bodies, authorization)

    async def prepare(self, body: Any, who: str | None, authorization: str | None) -> Turn:
        """Validate and lower a request for the client it acts for."""
        gateway = self.gateway
        headers = {"Authorization": authorization} if authorization is not None else {}
        client = gateway.client(who, headers)
        return await gateway.prepare(body, client=client, authorization=authorization)

    async def serve(
        self, turn: Turn, reply: Reply, answer: Callable[[Turn], Any] = _response
    ) -> None:
        """Run a prepared turn into `reply` (`Gateway.run` tracks it for the shutdown
        drain): the JSON of `answer(turn)`, or (`stream: true`) its events as SSE."""
        gateway = self.gateway
        gateway.stats["http_turns"] += 1
        if not turn.request.get("stream"):
            await gateway.run(turn, JSONSink(), "json")
            await reply.json(json_body(answer(turn)))
            return
        sink = SSESink(reply, self.keepalive)
        try:
            await gateway.run(turn, sink, "sse")
        except ConnectionResetError:  # the client left between two writes
            if not sink.answered:
                raise
            return
        finally:
            sink.close()
        await sink.end()

    def observe(
        self,
        method: str,
        route: str,
        path: str,
        offered: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> Observed:
        return Observed(self.gateway.metrics, method, route, path, offered, headers)
