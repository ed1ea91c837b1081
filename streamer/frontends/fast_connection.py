"""One client connection of the fast path, over plain bytes (sans I/O): which requests it
serves itself, and when aiohttp's protocol takes the connection over.

httptools (llhttp, the C parser under aiohttp) reads every byte the client sends, on one
continuous parser, as aiohttp's own would. A request is the fast path's only when its head
is a plain `POST /v1/responses` (`taken`) and the bytes held are that one request, whole,
with nothing after it. Anything else (another route, an odd head, an error llhttp finds, a
second request in the same bytes) and aiohttp is handed every read since the start of
that request, read by read, as it would have had them: what it answers then is what it
would have answered alone. So both servers answer every head alike, pipelines and bytes
after a `Connection: close` included (tests/test_fast_http.py checks it on generated heads).

States (`State`):

- HEAD: waiting for a request head (the front door's header timeout applies);
- BODY: a head taken and admitted (key, shutdown, media type, coding, length: `Rules`);
  its body comes, counted and decoded as it comes (the body timeout applies);
- ANSWERING: the request is being answered; what arrives meanwhile is parsed and held;
- DISCARDING: answered before its body was whole (a 401 from the head, a 413, a 408): the
  rest of the body is dropped as it comes, then the connection closes;
- HANDED_OVER: aiohttp's from here on; CLOSED.

Each event (`received`, `answered`, `expired`) returns the `Step` the shell takes next.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import http_parser
from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser

from streamer.core.errors import RequestError
from streamer.frontends.request_body import BodyReader, late

PATH = b"/v1/responses"
MAX_HEAD = 64 << 10  # held bytes with no head complete: beyond, aiohttp decides
MAX_FIELDS = 100  # aiohttp refuses more than 128 header fields: beyond 100, it decides
MAX_LENGTH_DIGITS = 18
# the fields the fast path reads (each given at most once), and those it leaves to aiohttp
WANTED = frozenset(
    {"content-length", "content-type", "content-encoding", "connection", "authorization"}
    | {"x-request-id", "traceparent", "tracestate"}  # tracestate: a client's trace (tracing.py)
)
REFUSED = frozenset({"transfer-encoding", "expect", "upgrade", "te", "trailer"})
REFUSED |= {"sec-websocket-key1"}  # aiohttp refuses the old WebSocket handshake
# RFC 9110's singleton fields: aiohttp (3.12 on) answers a 400 to any of them given twice
_SINGLETONS = [
    *("content-length", "content-location", "content-range", "content-type", "etag", "host"),
    *("max-forwards", "server", "transfer-encoding", "user-agent"),
]
SINGLETONS = frozenset(
    name.lower() for name in getattr(http_parser, "SINGLETON_HEADERS", _SINGLETONS)
)
NOTED = frozenset(name.encode() for name in WANTED | REFUSED | SINGLETONS)  # kept in a Head
CONNECTION = frozenset({"close", "keep-alive"})
# a Content-Type spelt plainly: type/subtype and token=token parameters (else aiohttp's
# email-style parse has the say)
_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_MEDIA = re.compile(rf"({_TOKEN}/{_TOKEN})(?:[ \t]*;[ \t]*{_TOKEN}={_TOKEN})*")


class State(enum.Enum):
    HEAD = "head"
    BODY = "body"
    ANSWERING = "answering"
    DISCARDING = "discarding"
    HANDED_OVER = "handed over"
    CLOSED = "closed"


class Step(enum.Enum):
    WAIT = "wait"  # nothing to do until more bytes (or a timer)
    SERVE = "serve"  # `request` is whole: answer it
    REFUSE = "refuse"  # answer `request`'s `error`; the connection closes after it
    HAND_OVER = "hand over"  # aiohttp's connection, with `handed` (the reads, in order)
    CLOSE = "close"


@dataclass(slots=True)
class Head:
    """A request head as llhttp read it."""

    method: bytes
    url: bytes
    version: str
    keep_alive: bool
    upgrade: bool
    fields: list[tuple[bytes, bytes]]


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~3x as much
class Request:
    """A request the fast path took: the fields it reads (lowercase names, values as aiohttp
    decodes them), its media type and declared length, and what admitting it found."""

    headers: dict[str, str]
    mime: str
    length: int
    close: bool
    who: str | None = None
    reader: BodyReader | None = None
    error: RequestError | None = None
    body: bytes = b""
    reads: list[bytes] = field(default_factory=list)  # its bytes as read, for a late hand-over


class Rules(Protocol):
    """What the endpoint decides from a taken head (`Request.who`, `Request.reader`), or
    the `RequestError` it answers instead: key, shutdown, media type, coding, length."""

    def admit(self, request: Request) -> None: ...


def media(value: str | None) -> str | None:
    """The media type of a plainly spelt Content-Type, lowercase (none: octet-stream)."""
    if value is None:
        return "application/octet-stream"
    match = _MEDIA.fullmatch(value)
    return match[1].lower() if match is not None else None


def taken(head: Head, max_field: int) -> Request | None:
    """The request of `head` if the fast path takes it, else None (aiohttp's): a plain
    HTTP/1.1 `POST /v1/responses` with one Host and a Content-Length, no field aiohttp
    would refuse (a singleton twice, one as long as its limit, too many), no field it
    leaves to aiohttp, each field it reads given once."""
    if head.method != b"POST" or head.url != PATH or head.version != "1.1" or head.upgrade:
        return None
    if len(head.fields) > MAX_FIELDS:
        return None
    headers: dict[str, str] = {}
    seen: set[str] = set()
    for raw_name, raw_value in head.fields:
        if len(raw_name) >= max_field or len(raw_value) >= max_field:
            return None
        low = raw_name.lower()
        if low not in NOTED:
            continue
        name = low.decode("latin-1")
        if name in REFUSED or (name in seen and (name in SINGLETONS or name in WANTED)):
            return None
        seen.add(name)
        if name in WANTED:  # llhttp keeps the blanks after a value, aiohttp does not
            headers[name] = raw_value.rstrip(b" \t").decode("utf-8", "surrogateescape")
    length = headers.get("content-length", "")
    connection = headers.get("connection")
    tokens = {t.strip().lower() for t in connection.split(",")} if connection is not None else set()
    mime = media(headers.get("content-type"))
    if "host" not in seen or not tokens <= CONNECTION or mime is None:
        return None
    if not (length.isascii() and length.isdigit()) or len(length) > MAX_LENGTH_DIGITS:
        return None
    return Request(headers, mime, int(length), not head.keep_alive)


class _Stop(Exception):
    """Raised in a parser callback: no need to parse further (a second request began)."""


class FastConnection:
    """See the module docstring. `rules` admits taken heads; `max_field` is aiohttp's limit
    on one header field (`--max-header-bytes`); `body_timeout`: the 408's seconds."""

    def __init__(self, rules: Rules, max_field: int, body_timeout: float) -> None:
        self.rules = rules
        self.max_field = max_field
        self.body_timeout = body_timeout
        self.state = State.HEAD
        self.request: Request | None = None  # the one taken, until it is answered
        self.handed: list[bytes] = []  # HAND_OVER: the reads aiohttp gets
        self._parser = HttpRequestParser(self)
        self._new_message()

    def _new_message(self) -> None:
        self._reads: list[bytes] = []  # every read since this request began
        self.held = 0  # their size
        self._begun = 0  # requests begun in them (a second one: aiohttp's)
        self._head: Head | None = None
        self._complete = False
        self._broken = False  # llhttp refused these bytes
        self._parts: list[bytes] = []  # body bytes not yet given to the reader
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._gave_up = False  # a 408: nothing more is waited for

    # -- the parser's callbacks (httptools) --------------------------------------------

    def on_message_begin(self) -> None:
        self._begun += 1
        if self._begun > 1:
            raise _Stop

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        self._head = Head(
            parser.get_method(),
            self._url,
            parser.get_http_version(),
            parser.should_keep_alive(),
            parser.should_upgrade(),
            self._fields,
        )

    def on_body(self, data: bytes) -> None:
        if self.state is not State.DISCARDING:
            self._parts.append(data)

    def on_message_complete(self) -> None:
        self._complete = True

    # -- events --------------------------------------------------------------------------

    def received(self, data: bytes) -> Step:
        """Bytes from the client."""
        state = self.state
        if state is State.HANDED_OVER or state is State.CLOSED:
            return Step.WAIT
        if state is not State.DISCARDING:
            self._reads.append(data)
            self.held += len(data)
        try:
            self._parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade):  # a callback's _Stop is wrapped in one
            self._broken = True  # or an upgrade (a WebSocket): aiohttp's either way
        if state is State.ANSWERING:
            return Step.WAIT  # decided once the answer has ended
        if state is State.DISCARDING:
            return Step.CLOSE if self._drained else Step.WAIT
        return self._next()

    def answered(self) -> Step:
        """The shell wrote the answer (SERVE) or the refusal (REFUSE)."""
        if self.state is State.DISCARDING:
            return Step.CLOSE if self._drained else Step.WAIT
        request, self.request = self.request, None
        if request is None or request.close:
            return self._close()
        self.state = State.HEAD
        return self._next()  # what came meanwhile

    def expired(self) -> Step:
        """The body timer: a body that did not arrive in time is a 408 (BODY), the
        rest of a refused one is given up (DISCARDING)."""
        if self.state is State.BODY:
            self._gave_up = True
            return self._refuse(late(self.body_timeout))
        return self._close() if self.state is State.DISCARDING else Step.WAIT

    def hand_over(self) -> list[bytes]:
        """The shell gives the request it was about to serve to aiohttp (a background
        turn): its reads, for aiohttp to read again."""
        request, self.request = self.request, None
        self.state = State.HANDED_OVER
        return [*(request.reads if request is not None else ()), *self._reads]

    def lost(self) -> None:
        self.state = State.CLOSED

    @property
    def busy(self) -> bool:
        """A request was taken and its answer has not ended (the front door's "busy"). A
        refused one is not: while its body is dropped the door may close it at its header
        timeout, or evict it, as it does an aiohttp connection lingering after its answer."""
        return self.request is not None and self.state is not State.DISCARDING

    # -- decisions -------------------------------------------------------------------------

    @property
    def _drained(self) -> bool:
        return self._complete or self._broken or self._begun > 1 or self._gave_up

    def _next(self) -> Step:
        """HEAD or BODY: what the bytes held call for."""
        if self._broken or self._begun > 1:
            return self._to_aiohttp()
        head = self._head
        if head is None:
            return self._to_aiohttp() if self.held > MAX_HEAD else Step.WAIT
        request = self.request
        if request is None:
            request = taken(head, self.max_field)
            if request is None:
                return self._to_aiohttp()
            self.request = request
            try:
                self.rules.admit(request)
            except RequestError as exc:
                return self._refuse(exc)
            self.state = State.BODY
        reader = request.reader
        assert reader is not None
        try:
            for part in self._parts:
                reader.feed(part)
            self._parts.clear()
            if not self._complete:
                return Step.WAIT
            request.body = reader.finish()
        except RequestError as exc:
            return self._refuse(exc)
        request.reads = self._reads
        self._new_message()
        self.state = State.ANSWERING
        return Step.SERVE

    def _refuse(self, error: RequestError) -> Step:
        assert self.request is not None
        self.request.error = error.with_traceback(None)  # its frames may hold body bytes
        self._parts.clear()
        self._reads = []  # never handed over now
        self.state = State.DISCARDING
        return Step.REFUSE

    def _to_aiohttp(self) -> Step:
        self.handed = self._reads
        self.request = None
        self.state = State.HANDED_OVER
        return Step.HAND_OVER

    def _close(self) -> Step:
        self.state = State.CLOSED
        return Step.CLOSE
